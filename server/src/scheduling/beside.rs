//! The leader's work beside its cycles (explaining a long queue, forecasting starts) runs on
//! one thread of its own at a lower CPU priority (`SCHED_BATCH`, nice 10). Both are whole
//! policy passes over the queue, hundreds of milliseconds each on a long one; on the default
//! blocking threads they took the cores from the cycle that was running, and a cycle's time
//! swung with whether one of them happened to run beside it. At a lower priority they yield
//! to the cycles, the agents' polls and the submissions, which someone is waiting for, and
//! take the CPU left over (about a tenth of a core when every core is busy, all of it when
//! idle).

use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{channel, Sender};
use std::sync::OnceLock;

use tokio::task::JoinHandle;

type Job = Box<dyn FnOnce() + Send>;

/// The nice value of the thread, as Linux counts it: 0 is the default, 19 the lowest.
pub const NICE: i32 = 10;

static WORKER: OnceLock<Sender<Job>> = OnceLock::new();

fn worker() -> &'static Sender<Job> {
    WORKER.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        let started = std::thread::Builder::new()
            .name("autodl-beside".into())
            .spawn(move || {
                lower_priority();
                for job in rx {
                    // A job that panics fails alone: its caller sees the failure and the
                    // thread takes the next one.
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                }
            });
        if let Err(e) = started {
            // The jobs then run on the blocking threads (see `spawn`).
            tracing::warn!(error = %e, "no thread for the work beside the cycles");
        }
        tx
    })
}

/// Lowers the calling thread's priority; where the system refuses (another OS, a sandbox),
/// the work runs at the normal priority and says so once.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        use thread_priority::{
            set_thread_priority_and_policy, thread_native_id, NormalThreadSchedulePolicy,
            ThreadPriority, ThreadPriorityValue, ThreadSchedulePolicy,
        };
        // The crate maps 0..=99 onto nice 19..=-20; 22 is nice 10.
        let lowered = ThreadPriorityValue::try_from(22u8)
            .map_err(|e| e.to_string())
            .and_then(|v| {
                set_thread_priority_and_policy(
                    thread_native_id(),
                    ThreadPriority::Crossplatform(v),
                    ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Batch),
                )
                .map_err(|e| format!("{e:?}"))
            });
        if let Err(e) = lowered {
            tracing::warn!(error = %e, "the work beside the cycles runs at the normal priority");
        }
    }
}

/// Runs `f` on the thread beside the cycles; its handle is awaited like a blocking task's.
pub fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(f());
    });
    if let Err(refused) = worker().send(job) {
        tokio::task::spawn_blocking(refused.0);
    }
    tokio::spawn(async move {
        match rx.await {
            Ok(v) => v,
            // The job panicked: fail this task the way a panicking blocking task fails.
            Err(_) => std::panic::panic_any("a job beside the cycles panicked"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's nice value, as the kernel reports it.
    fn own_nice() -> Option<i32> {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
        // Fields after the command name, which is in parentheses: state is the 3rd, nice the 19th.
        let rest = &stat[stat.rfind(')')? + 2..];
        rest.split_whitespace().nth(16)?.parse().ok()
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn jobs_run_on_one_thread_at_a_lower_priority() {
        let (name, policy, nice) = spawn(|| {
            (
                std::thread::current().name().map(str::to_owned),
                thread_priority::thread_schedule_policy().ok(),
                own_nice(),
            )
        })
        .await
        .expect("the job ran");
        assert_eq!(name.as_deref(), Some("autodl-beside"));
        assert_eq!(
            policy,
            Some(thread_priority::ThreadSchedulePolicy::Normal(
                thread_priority::NormalThreadSchedulePolicy::Batch
            ))
        );
        assert_eq!(nice, Some(NICE));
        // The cycles' own threads keep theirs.
        assert_eq!(own_nice(), Some(0));
    }

    #[tokio::test]
    async fn a_job_that_panics_fails_alone() {
        let failed = spawn(|| -> u32 { panic!("boom") }).await;
        assert!(failed.is_err());
        assert_eq!(spawn(|| 7).await.expect("the next job ran"), 7);
    }
}
