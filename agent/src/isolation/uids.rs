//! Task users: each isolated task runs as its own unprivileged uid, leased from a configured
//! range. Leases are `flock`s on one file per uid in a host-wide folder, so several agents on
//! one host (the demo runs two in one process) never hand the same uid to two tasks, and a
//! lease dies with the agent that held it.

use std::fs::File;
use std::io::ErrorKind;
use std::ops::RangeInclusive;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The uid and gid a task runs as (the same number for both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskUser {
    pub uid: u32,
    pub gid: u32,
}

/// A uid held for one attempt. Dropping it stops every process still running as that uid
/// before the uid can be leased again: a task must not leave a daemon behind that the next
/// task with the same uid could talk to.
#[derive(Debug)]
pub struct UidLease {
    user: TaskUser,
    _lock: Flock<File>,
}

impl UidLease {
    pub fn user(&self) -> TaskUser {
        self.user
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        kill_all(self.user.uid);
    }
}

#[derive(Debug, Clone)]
pub struct UidPool {
    range: RangeInclusive<u32>,
    dir: PathBuf,
}

impl UidPool {
    /// `dir` holds one lock file per uid; it is created (mode 0700) if missing.
    pub fn new(range: RangeInclusive<u32>, dir: impl Into<PathBuf>) -> std::io::Result<UidPool> {
        let dir = dir.into();
        if range.is_empty() || *range.start() == 0 {
            return Err(std::io::Error::new(
                ErrorKind::InvalidInput,
                format!("task uid range {range:?} is empty or includes root"),
            ));
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        Ok(UidPool { range, dir })
    }

    pub fn range(&self) -> &RangeInclusive<u32> {
        &self.range
    }

    fn try_lock(&self, uid: u32) -> std::io::Result<Option<Flock<File>>> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.dir.join(uid.to_string()))?;
        match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(l) => Ok(Some(l)),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, e)) => Err(std::io::Error::from(e)),
        }
    }

    /// The lowest free uid of the range. Processes left running as it by an agent that died
    /// are stopped first.
    pub fn lease(&self) -> std::io::Result<UidLease> {
        for uid in self.range.clone() {
            if let Some(lock) = self.try_lock(uid)? {
                kill_all(uid);
                return Ok(UidLease {
                    user: TaskUser { uid, gid: uid },
                    _lock: lock,
                });
            }
        }
        Err(std::io::Error::new(
            ErrorKind::ResourceBusy,
            format!("every task uid in {:?} is in use", self.range),
        ))
    }

    /// Stops processes of uids in the range that no live agent holds: what an agent killed
    /// with SIGKILL left behind. Returns how many were signalled.
    pub fn reap_orphans(&self) -> usize {
        let mut uids: Vec<u32> = processes()
            .into_iter()
            .filter(|p| self.range.contains(&p.uid))
            .map(|p| p.uid)
            .collect();
        uids.sort_unstable();
        uids.dedup();
        let mut n = 0;
        for uid in uids {
            if let Ok(Some(_lock)) = self.try_lock(uid) {
                n += kill_all(uid);
            }
        }
        n
    }
}

struct Proc {
    pid: i32,
    uid: u32,
}

/// Live (not zombie) processes and their real uid, from /proc.
fn processes() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(status) =
            std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("status"))
        else {
            continue;
        };
        let mut uid = None;
        let mut zombie = false;
        for line in status.lines() {
            if let Some(v) = line.strip_prefix("Uid:") {
                uid = v.split_whitespace().next().and_then(|u| u.parse().ok());
            } else if let Some(v) = line.strip_prefix("State:") {
                zombie = v.trim_start().starts_with(['Z', 'X']);
            }
        }
        if let (Some(uid), false) = (uid, zombie) {
            out.push(Proc { pid, uid });
        }
    }
    out
}

/// Sends `sig` to every process running as `uid`; returns how many there were.
pub fn signal_uid(uid: u32, sig: Signal) -> usize {
    let mut n = 0;
    for p in processes().into_iter().filter(|p| p.uid == uid) {
        if kill(Pid::from_raw(p.pid), sig).is_ok() {
            n += 1;
        }
    }
    n
}

/// SIGKILLs every process of `uid` until none is left (a process may fork while we look).
/// Returns how many were killed. Never called for uids outside a task range.
pub fn kill_all(uid: u32) -> usize {
    if uid == 0 {
        return 0;
    }
    // A killed process stays listed until it has exited, which takes longer on a loaded
    // host: keep at it for a few seconds rather than a fixed number of rounds.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut total = 0;
    loop {
        let n = signal_uid(uid, Signal::SIGKILL);
        if n == 0 || std::time::Instant::now() >= deadline {
            break;
        }
        total += n;
        std::thread::sleep(Duration::from_millis(5));
    }
    total
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_exclusive_across_pools_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let a = UidPool::new(3_900_000..=3_900_001, dir.path().join("locks")).unwrap();
        // A second pool over the same folder stands for another agent on the host.
        let b = UidPool::new(3_900_000..=3_900_001, dir.path().join("locks")).unwrap();
        let first = a.lease().unwrap();
        let second = b.lease().unwrap();
        assert_ne!(first.user().uid, second.user().uid);
        assert_eq!(first.user().uid, first.user().gid);
        assert!(a.lease().is_err(), "range exhausted");
        let freed = first.user().uid;
        drop(first);
        assert_eq!(b.lease().unwrap().user().uid, freed);
        assert!(
            UidPool::new(0..=10, dir.path()).is_err(),
            "root is never a task uid"
        );
    }

    #[test]
    fn processes_of_a_uid_are_found() {
        let me = nix::unistd::getuid().as_raw();
        let mine = processes().into_iter().filter(|p| p.uid == me).count();
        assert!(mine >= 1, "this test process runs as {me}");
    }
}
