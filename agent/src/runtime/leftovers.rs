//! Process groups of running attempts, written down so that an agent killed without a chance
//! to stop its tasks (SIGKILL, a crash, a power cut of the agent alone) stops them at its next
//! start instead of leaving them running beside the attempt the server starts again.
//!
//! A record names the group leader's pid and its start time: a pid that was reused by an
//! unrelated process since has another start time and is left alone. Records live in a folder
//! only the agent can write (tasks must not be able to name a process for it to kill).

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use super::safe_name;

pub struct Leftovers {
    dir: PathBuf,
}

/// One attempt's record; removed when the attempt ends (dropped).
pub struct Record(PathBuf);

impl Drop for Record {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Start time of a process in clock ticks since boot (`/proc/<pid>/stat`, field 22).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

impl Leftovers {
    pub fn new(state_dir: &Path) -> Leftovers {
        Leftovers {
            dir: state_dir.join("run"),
        }
    }

    /// Notes that `pid` leads the process group of this attempt (of its worker `rank` when it
    /// runs a process per worker).
    pub fn record(
        &self,
        task: &str,
        attempt: u32,
        rank: Option<u32>,
        pid: u32,
    ) -> std::io::Result<Record> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        let pid = i32::try_from(pid).map_err(std::io::Error::other)?;
        let started = start_time(pid).ok_or_else(|| std::io::Error::other("no such process"))?;
        let path = match rank {
            Some(r) => self
                .dir
                .join(format!("{}-{attempt}-rank{r}", safe_name(task))),
            None => self.dir.join(format!("{}-{attempt}", safe_name(task))),
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)?;
        std::io::Write::write_all(&mut f, format!("{pid} {started}\n").as_bytes())?;
        Ok(Record(path))
    }

    /// Kills the process groups an earlier run of the agent recorded and did not end.
    /// Returns how many it killed.
    pub fn reap(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut killed = 0;
        for e in entries.flatten() {
            let path = e.path();
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let mut parts = text.split_whitespace();
            let pid = parts.next().and_then(|p| p.parse::<i32>().ok());
            let started = parts.next().and_then(|s| s.parse::<u64>().ok());
            if let (Some(pid), Some(started)) = (pid, started) {
                if pid > 1 && start_time(pid) == Some(started) {
                    tracing::warn!(pid, record = %path.display(), "stopping a task an earlier agent run left running");
                    if killpg(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                        killed += 1;
                    }
                }
            }
            let _ = std::fs::remove_file(&path);
        }
        killed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn a_recorded_group_is_killed_and_a_reused_pid_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let left = Leftovers::new(dir.path());
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let record = left.record("task/1", 2, None, child.id()).unwrap();
        // The agent dies: its record stays.
        std::mem::forget(record);
        // A record whose pid now belongs to someone else (another start time) is ignored.
        std::fs::write(
            dir.path().join("run").join("other-1"),
            format!("{} 1\n", std::process::id()),
        )
        .unwrap();
        assert_eq!(left.reap(), 1);
        let status = child.wait().unwrap();
        assert!(!status.success());
        assert_eq!(
            std::fs::read_dir(dir.path().join("run")).unwrap().count(),
            0
        );
        // Ended attempts leave no record behind.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        drop(left.record("t", 1, Some(3), child.id()));
        child.wait().unwrap();
        assert_eq!(left.reap(), 0);
    }
}
