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
    /// Taken into quarantine when the uid could not be cleared.
    lock: Option<Flock<File>>,
}

impl UidLease {
    pub fn user(&self) -> TaskUser {
        self.user
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        if !clear(self.user.uid) {
            // Something of this tenant outlived its attempt: the uid is never handed to
            // another while this agent runs (its lock is kept).
            if let Some(lock) = self.lock.take() {
                lock_quarantine().push(lock);
            }
        }
    }
}

/// Stops every process of `uid` and removes what it left in the shared folders; false (and
/// the operator told) when something of it remains, so that no other tenant gets the uid.
fn clear(uid: u32) -> bool {
    kill_all(uid);
    let running = signal_uid(uid, Signal::SIGKILL);
    let left = remove_leftovers(uid);
    if running > 0 || left > 0 {
        tracing::error!(
            uid,
            running,
            left,
            "a task uid could not be cleared of what its task left; it is kept out of use"
        );
        return false;
    }
    true
}

/// Locks of uids kept out of use for the agent's life.
fn lock_quarantine() -> std::sync::MutexGuard<'static, Vec<Flock<File>>> {
    static KEPT: std::sync::Mutex<Vec<Flock<File>>> = std::sync::Mutex::new(Vec::new());
    KEPT.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Folders every user may write to, where a task without a mount namespace of its own leaves
/// files the next task of its uid (another organization's) would find.
/// (`/dev/mqueue` holds POSIX message queues where it is mounted.)
pub const SHARED_FOLDERS: [&str; 4] = ["/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue"];

/// Removes what `uid` owns in the host's shared folders (and in root's world-writable folders
/// below them, such as `/tmp/.X11-unix`), once none of its processes is left. Done beneath
/// folder handles with no link followed: other tasks may be changing these folders meanwhile.
/// Returns how many entries of the uid are left there (0: the uid is clear).
pub fn remove_leftovers(uid: u32) -> usize {
    if uid == 0 {
        return 0;
    }
    let mut removed = 0;
    let mut left = 0;
    for root in SHARED_FOLDERS {
        if let Ok(folder) = crate::beneath::Folder::open(Path::new(root)) {
            let (r, l) = remove_owned(&folder, uid, 0);
            removed += r;
            left += l;
        }
    }
    let (r, l) = remove_ipc(uid);
    removed += r;
    left += l;
    if removed > 0 {
        tracing::info!(
            uid,
            removed,
            "removed what a task left in the host's shared folders and System V IPC"
        );
    }
    left
}

/// `(removed, left)` of the System V shared memory segments, message queues and semaphore
/// sets `uid` owns or made. A task without an IPC namespace of its own (uid-only nodes)
/// makes them in the host's, with whatever permissions it likes, and they outlive it.
fn remove_ipc(uid: u32) -> (usize, usize) {
    let (mut removed, mut left) = (0, 0);
    for (kind, table) in [
        (("shm", "shmem"), "/proc/sysvipc/shm"),
        (("msg", "queue"), "/proc/sysvipc/msg"),
        (("sem", "semaphore"), "/proc/sysvipc/sem"),
    ] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for id in ipc_ids_of(&text, uid) {
            // util-linux's ipcrm (the workspace holds no unsafe code for the system call).
            let out = std::process::Command::new("ipcrm")
                .arg(format!("--{}-id", kind.1))
                .arg(id.to_string())
                .stdin(std::process::Stdio::null())
                .output();
            match out {
                Ok(o) if o.status.success() => removed += 1,
                // Removed meanwhile (by its last user): gone all the same.
                Ok(o) if String::from_utf8_lossy(&o.stderr).contains("invalid") => removed += 1,
                Ok(o) => {
                    tracing::warn!(uid, kind = kind.0, id, error = %String::from_utf8_lossy(&o.stderr).trim(), "could not remove a task's IPC object");
                    left += 1;
                }
                Err(e) => {
                    tracing::warn!(uid, kind = kind.0, id, error = %e, "could not remove a task's IPC object (is util-linux's ipcrm installed?)");
                    left += 1;
                }
            }
        }
    }
    (removed, left)
}

/// The ids in a `/proc/sysvipc/*` table of the objects whose owner or creator is `uid`
/// (columns found by the table's header, which differs between the three).
fn ipc_ids_of(table: &str, uid: u32) -> Vec<i32> {
    let mut lines = table.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let col = |name: &str| header.split_whitespace().position(|c| c == name);
    let (Some(id), Some(owner), Some(creator)) = (
        header
            .split_whitespace()
            .position(|c| c == "shmid" || c == "msqid" || c == "semid"),
        col("uid"),
        col("cuid"),
    ) else {
        return Vec::new();
    };
    lines
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let is = |i: usize| f.get(i).and_then(|v| v.parse::<u32>().ok()) == Some(uid);
            (is(owner) || is(creator))
                .then(|| f.get(id)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// `(removed, left)` of `uid`'s entries in `folder` and in root's world-writable folders
/// below it (only root's: another user's folder could be rearranged under the walk).
fn remove_owned(folder: &crate::beneath::Folder, uid: u32, depth: usize) -> (usize, usize) {
    let (mut removed, mut left) = (0, 0);
    for (name, owner, shared_dir) in folder.entries().unwrap_or_default() {
        if owner == uid {
            match folder.remove_raw(&name) {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::warn!(uid, name = ?name, error = %e, "could not remove what a task left");
                    left += 1;
                }
            }
        } else if shared_dir && owner == 0 && depth < 4 {
            if let Ok(sub) = folder.open_dir_raw(&name) {
                let (r, l) = remove_owned(&sub, uid, depth + 1);
                removed += r;
                left += l;
            }
        }
    }
    (removed, left)
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
                // What an agent that died left of this uid goes first; a uid that cannot be
                // cleared is skipped (another tenant would find what is left of it).
                if !clear(uid) {
                    lock_quarantine().push(lock);
                    continue;
                }
                return Ok(UidLease {
                    user: TaskUser { uid, gid: uid },
                    lock: Some(lock),
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
    fn ipc_objects_are_found_by_owner_or_creator() {
        let shm = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n\
                            0         17   666                  4096   100   100      0  2000000  2000000  0  0 0 0 0 4096 0\n\
                            0         18   600                  4096   100   100      0  0  0  2000000  0 0 0 0 4096 0\n\
                            0         19   600                  4096   100   100      0  0  0  0  0 0 0 0 4096 0\n";
        assert_eq!(ipc_ids_of(shm, 2_000_000), vec![17, 18]);
        let sem = "       key      semid perms      nsems   uid   gid  cuid  cgid      otime      ctime\n\
                            5          3   666          1  2000001  0  0  0 0 0\n";
        assert_eq!(ipc_ids_of(sem, 2_000_001), vec![3]);
        assert!(ipc_ids_of(sem, 2_000_000).is_empty());
        assert!(ipc_ids_of("", 1).is_empty());
    }

    /// A real segment made over to a task uid is gone once the uid's leftovers are removed.
    #[test]
    fn a_uid_s_shared_memory_is_removed() {
        if !is_root() {
            crate::skip("giving a segment to another uid needs root");
            return;
        }
        let uid = 3_900_123;
        let made = std::process::Command::new("setpriv")
            .args([
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                "--clear-groups",
                "ipcmk",
                "-M",
                "4096",
                "-p",
                "0666",
            ])
            .output()
            .unwrap();
        assert!(made.status.success(), "{made:?}");
        // "Shared memory id: N"
        let id: i32 = String::from_utf8_lossy(&made.stdout)
            .rsplit(':')
            .next()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{made:?}"));
        assert!(
            ipc_ids_of(&std::fs::read_to_string("/proc/sysvipc/shm").unwrap(), uid).contains(&id)
        );
        assert_eq!(remove_leftovers(uid), 0);
        assert!(
            !ipc_ids_of(&std::fs::read_to_string("/proc/sysvipc/shm").unwrap(), uid).contains(&id)
        );
    }

    #[test]
    fn processes_of_a_uid_are_found() {
        let me = nix::unistd::getuid().as_raw();
        let mine = processes().into_iter().filter(|p| p.uid == me).count();
        assert!(mine >= 1, "this test process runs as {me}");
    }
}
