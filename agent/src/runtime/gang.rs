//! Waiting for the processes (or containers) of one attempt: a gang lives and dies together.
//!
//! Both runtimes start an attempt's workers and hand their exits here. When every worker
//! ended, the attempt ended. When one of several fails, its collective cannot go on: the
//! others are asked to end (SIGTERM) and, after [`PEER_GRACE`], killed. A stop the agent asks
//! for ends them all the same way with the stop's grace period.

use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use tokio::sync::watch;

use super::{RuntimeError, PEER_GRACE};
use crate::logs::LogBuffer;
use crate::protocol::Stream;

/// A worker's end: its exit code (128 + the signal after a signal), or why it could not be
/// waited for.
pub(crate) type WorkerExit<'a> = BoxFuture<'a, (usize, Result<i64, RuntimeError>)>;

/// How a runtime signals the workers of an attempt, by their index.
#[async_trait]
pub(crate) trait Workers: Sync {
    /// Asks them to end (SIGTERM).
    async fn terminate(&self, which: &[usize]);
    /// Ends them now (SIGKILL).
    async fn kill(&self, which: &[usize]);
}

/// How an attempt's workers ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GangEnd {
    /// Each worker's exit code, by index.
    pub codes: Vec<Option<i64>>,
    /// The worker whose failure ended the others.
    pub failed: Option<usize>,
    /// The agent asked for the stop.
    pub stopped: bool,
    /// The gang never formed, and why: its workers were ended.
    pub unformed: Option<String>,
}

impl GangEnd {
    /// The attempt's exit code: the failed worker's, else the first that is not 0 (in rank
    /// order), else 0.
    pub fn exit_code(&self) -> i64 {
        self.failed
            .and_then(|i| self.codes[i])
            .or_else(|| self.codes.iter().flatten().find(|c| **c != 0).copied())
            .unwrap_or(0)
    }
}

/// Says why a gang did not form, if it did not ([`super::Rendezvous::unformed`]).
pub(crate) type Formation<'a> = BoxFuture<'a, String>;

/// Waits for the workers whose exits are `waits` (`ranks`: each one's rank, by index). An
/// error waiting for one kills them all and is returned. `formation`, on rank 0's node of a
/// gang, ends them all when it resolves.
pub(crate) async fn wait_for_workers(
    waits: Vec<WorkerExit<'_>>,
    ranks: &[Option<u32>],
    workers: &dyn Workers,
    stop: &mut watch::Receiver<Option<Duration>>,
    output: &LogBuffer,
    formation: Option<Formation<'_>>,
) -> Result<GangEnd, RuntimeError> {
    let n = waits.len();
    let mut waits: FuturesUnordered<_> = waits.into_iter().collect();
    let mut end = GangEnd {
        codes: vec![None; n],
        failed: None,
        stopped: false,
        unformed: None,
    };
    let watching = formation.is_some();
    let mut formation = formation.unwrap_or_else(|| Box::pin(std::future::pending()));
    let all: Vec<usize> = (0..n).collect();
    let mut stop_open = true;
    // How long the workers still running get: a stop's grace, or the peers' of one that failed.
    let mut grace = None;
    while !waits.is_empty() {
        let requested = *stop.borrow_and_update();
        if let Some(g) = requested {
            end.stopped = true;
            grace = Some(g);
            break;
        }
        tokio::select! {
            Some((i, exit)) = waits.next() => {
                let code = match exit {
                    Ok(code) => code,
                    Err(e) => {
                        workers.kill(&all).await;
                        return Err(e);
                    }
                };
                end.codes[i] = Some(code);
                if code != 0 && n > 1 {
                    end.failed = Some(i);
                    grace = Some(PEER_GRACE);
                    output.push(
                        Stream::Stderr,
                        format!(
                            "[autodl-agent] worker {} exited with code {code}: stopping the other workers",
                            ranks.get(i).copied().flatten().unwrap_or(0)
                        ),
                    );
                    break;
                }
            }
            why = &mut formation, if watching => {
                output.push(
                    Stream::Stderr,
                    format!("[autodl-agent] {why}: stopping the workers"),
                );
                end.unformed = Some(why);
                grace = Some(PEER_GRACE);
                break;
            }
            changed = stop.changed(), if stop_open => {
                if changed.is_err() {
                    // The agent dropped its handle; nobody can ask for a stop any more.
                    stop_open = false;
                }
            }
        }
    }
    if waits.is_empty() {
        return Ok(end);
    }
    let running: Vec<usize> = (0..n).filter(|i| end.codes[*i].is_none()).collect();
    workers.terminate(&running).await;
    let deadline = tokio::time::Instant::now() + grace.unwrap_or(PEER_GRACE);
    let mut killed = false;
    loop {
        let next = if killed {
            waits.next().await
        } else {
            match tokio::time::timeout_at(deadline, waits.next()).await {
                Ok(next) => next,
                Err(_) => {
                    workers.kill(&running).await;
                    killed = true;
                    continue;
                }
            }
        };
        match next {
            Some((i, Ok(code))) => end.codes[i] = Some(code),
            Some((_, Err(e))) => {
                workers.kill(&all).await;
                return Err(e);
            }
            None => return Ok(end),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Workers that end with the given codes after the given delays, or (`None`) only when
    /// signalled; every signal is noted.
    struct Fake {
        ends: Vec<(u64, Option<i64>)>,
        signals: Mutex<Vec<(&'static str, Vec<usize>)>>,
        ended: tokio::sync::watch::Sender<bool>,
    }

    #[async_trait]
    impl Workers for Fake {
        async fn terminate(&self, which: &[usize]) {
            self.signals.lock().unwrap().push(("TERM", which.to_vec()));
            self.ended.send_replace(true);
        }
        async fn kill(&self, which: &[usize]) {
            self.signals.lock().unwrap().push(("KILL", which.to_vec()));
        }
    }

    fn exits(fake: &Fake) -> Vec<WorkerExit<'_>> {
        fake.ends
            .iter()
            .enumerate()
            .map(|(i, (ms, code))| {
                let mut ended = fake.ended.subscribe();
                let (ms, code) = (*ms, *code);
                Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    match code {
                        Some(c) => (i, Ok(c)),
                        None => {
                            let _ = ended.wait_for(|e| *e).await;
                            (i, Ok(143))
                        }
                    }
                }) as WorkerExit<'_>
            })
            .collect()
    }

    fn fake(ends: Vec<(u64, Option<i64>)>) -> Fake {
        Fake {
            ends,
            signals: Mutex::new(Vec::new()),
            ended: tokio::sync::watch::channel(false).0,
        }
    }

    #[tokio::test]
    async fn a_failing_worker_ends_its_peers_and_names_the_code() {
        let f = fake(vec![(0, None), (10, Some(3)), (0, None)]);
        let (_tx, mut stop) = watch::channel(None);
        let log = LogBuffer::new(10);
        let end = wait_for_workers(
            exits(&f),
            &[Some(0), Some(1), Some(2)],
            &f,
            &mut stop,
            &log,
            None,
        )
        .await
        .unwrap();
        assert_eq!(end.failed, Some(1));
        assert_eq!(end.exit_code(), 3);
        assert!(!end.stopped);
        assert_eq!(*f.signals.lock().unwrap(), [("TERM", vec![0, 2])]);
        assert!(log.take_batch(10)[0]
            .line
            .contains("worker 1 exited with code 3"));
    }

    #[tokio::test]
    async fn all_ending_well_is_success_and_a_stop_ends_them_all() {
        let f = fake(vec![(5, Some(0)), (1, Some(0))]);
        let (_tx, mut stop) = watch::channel(None);
        let log = LogBuffer::new(10);
        let end = wait_for_workers(exits(&f), &[Some(0), Some(1)], &f, &mut stop, &log, None)
            .await
            .unwrap();
        assert_eq!((end.exit_code(), end.failed), (0, None));
        assert!(f.signals.lock().unwrap().is_empty());

        let f = fake(vec![(0, None), (0, None)]);
        let (tx, mut stop) = watch::channel(None);
        tx.send_replace(Some(Duration::from_secs(5)));
        let end = wait_for_workers(exits(&f), &[Some(0), Some(1)], &f, &mut stop, &log, None)
            .await
            .unwrap();
        assert!(end.stopped);
        assert_eq!(end.exit_code(), 143);
        assert_eq!(*f.signals.lock().unwrap(), [("TERM", vec![0, 1])]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_deaf_to_sigterm_is_killed_after_the_grace_period() {
        /// Ends only on SIGKILL.
        struct Deaf(tokio::sync::watch::Sender<bool>, Mutex<Vec<&'static str>>);
        #[async_trait]
        impl Workers for Deaf {
            async fn terminate(&self, _: &[usize]) {
                self.1.lock().unwrap().push("TERM");
            }
            async fn kill(&self, _: &[usize]) {
                self.1.lock().unwrap().push("KILL");
                self.0.send_replace(true);
            }
        }
        let deaf = Deaf(tokio::sync::watch::channel(false).0, Mutex::new(Vec::new()));
        let mut killed = deaf.0.subscribe();
        let waits: Vec<WorkerExit<'_>> = vec![
            Box::pin(async { (0, Ok(1)) }),
            Box::pin(async move {
                let _ = killed.wait_for(|k| *k).await;
                (1, Ok(137))
            }),
        ];
        let (_tx, mut stop) = watch::channel(None);
        let log = LogBuffer::new(10);
        let began = tokio::time::Instant::now();
        let end = wait_for_workers(waits, &[Some(0), Some(1)], &deaf, &mut stop, &log, None)
            .await
            .unwrap();
        assert_eq!(began.elapsed(), PEER_GRACE);
        assert_eq!(*deaf.1.lock().unwrap(), ["TERM", "KILL"]);
        assert_eq!(end.codes, [Some(1), Some(137)]);
        assert_eq!(end.exit_code(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_gang_that_did_not_form_is_ended_saying_why() {
        let f = fake(vec![(0, None), (0, None)]);
        let (_tx, mut stop) = watch::channel(None);
        let log = LogBuffer::new(10);
        let formation: Formation<'_> = Box::pin(async {
            tokio::time::sleep(Duration::from_secs(600)).await;
            "the gang did not form".to_owned()
        });
        let end = wait_for_workers(
            exits(&f),
            &[Some(0), Some(1)],
            &f,
            &mut stop,
            &log,
            Some(formation),
        )
        .await
        .unwrap();
        assert_eq!(end.unformed.as_deref(), Some("the gang did not form"));
        assert!(!end.stopped);
        assert_eq!(*f.signals.lock().unwrap(), [("TERM", vec![0, 1])]);
        assert!(log.take_batch(10)[0]
            .line
            .contains("the gang did not form: stopping the workers"));
    }
}
