//! How tasks of different organizations are kept apart on one host.
//!
//! Tasks are untrusted code. Whatever the runtime, a task sees only an allow-listed
//! environment (never the agent's or, in the demo, the server's), and when the agent runs as
//! root every task runs as its own unprivileged uid ([`uids`]) in folders only that uid can
//! reach. Under the process runtime the task also gets its own mount, pid, IPC and UTS
//! namespaces through bubblewrap ([`sandbox`]), which shows it the system folders read-only,
//! its own task folder and nothing else of the host. A node that can do none of this (not
//! root) reports itself trusted-only and the server sends it only tasks of organizations an
//! administrator allowed there.

pub mod limits;
pub mod network;
pub mod sandbox;
pub mod uids;

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub use sandbox::Sandbox;

use crate::beneath::Folder;
pub use uids::{is_root, kill_all, signal_uid, TaskUser, UidLease, UidPool};

/// Reported to the server at registration and in every poll, shown to administrators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IsolationLevel {
    /// Docker containers, as a task uid when the agent is root.
    Container,
    /// Processes as a task uid in their own namespaces (bubblewrap).
    Sandbox,
    /// Processes as a task uid, without namespaces (no bubblewrap here).
    Uid,
    /// Processes as the agent's own user: only for tenants an administrator trusts.
    None,
}

impl IsolationLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            IsolationLevel::Container => "container",
            IsolationLevel::Sandbox => "sandbox",
            IsolationLevel::Uid => "uid",
            IsolationLevel::None => "none",
        }
    }

    /// Tasks of different organizations must not share this node.
    pub fn trusted_only(self) -> bool {
        self == IsolationLevel::None
    }
}

/// What the operator asks for (`--isolation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IsolationChoice {
    /// The strongest level this host offers; trusted-only (with a warning) when none.
    #[default]
    Auto,
    /// Refuse to start unless tasks can be isolated.
    Required,
    /// Run tasks as the agent's user: the node is trusted-only.
    Off,
}

/// Settings of task isolation, part of [`crate::AgentConfig`].
#[derive(Debug, Clone)]
pub struct IsolationConfig {
    pub choice: IsolationChoice,
    /// Uids (and gids) handed to tasks; must not belong to anyone else on the host.
    pub task_uids: RangeInclusive<u32>,
    /// Host-wide folder of uid lease locks, shared by every agent on the host.
    pub lock_dir: PathBuf,
    /// `bwrap`; looked up on PATH when unset.
    pub bwrap: Option<PathBuf>,
    /// Host folders tasks may read under the sandbox besides the system folders (a shared
    /// conda or Python installation, a checkout of training scripts).
    pub read_only_paths: Vec<PathBuf>,
    /// Variables the operator gives every task (e.g. `LD_LIBRARY_PATH` of a CUDA install).
    pub task_env: BTreeMap<String, String>,
    /// Most processes one task may hold (Docker's pids limit, a cgroup's for processes).
    pub pids_limit: i64,
    /// The networks of process-runtime tasks.
    pub network: network::NetworkConfig,
}

pub const DEFAULT_TASK_UIDS: RangeInclusive<u32> = 2_000_000..=2_099_999;
pub const DEFAULT_LOCK_DIR: &str = "/run/autodl-agent/uids";

impl Default for IsolationConfig {
    fn default() -> Self {
        IsolationConfig {
            choice: IsolationChoice::Auto,
            task_uids: DEFAULT_TASK_UIDS,
            lock_dir: PathBuf::from(DEFAULT_LOCK_DIR),
            bwrap: None,
            read_only_paths: Vec::new(),
            task_env: BTreeMap::new(),
            pids_limit: 4096,
            network: network::NetworkConfig::default(),
        }
    }
}

/// Variables of the agent's own environment a task may inherit: locale, time zone and the
/// search path. Everything else (credentials, the server's secrets in the demo) stays out.
pub fn inherited_env() -> BTreeMap<String, String> {
    std::env::vars()
        .filter(|(k, _)| {
            matches!(k.as_str(), "PATH" | "LANG" | "LANGUAGE" | "TZ") || k.starts_with("LC_")
        })
        .collect()
}

/// The PATH of a task when the agent has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A name a shell can export; anything else is not passed to sandboxed tasks.
pub fn is_env_name(k: &str) -> bool {
    let mut c = k.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The sub-folders of a task folder. The task folder itself belongs to root (group: the task's
/// gid, mode 0750) so the task cannot swap these for links to files of the host: the agent
/// reads and writes them as root.
pub const TASK_SUBDIRS: [&str; 5] = ["checkpoints", "results", "home", "tmp", "code"];

fn chown(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))
}

fn chmod(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Gives the task's sub-folders (and everything in them, e.g. a restored checkpoint) to the
/// task user, and the task folder to root with the task's group. The sub-folders are walked
/// beneath a handle ([`crate::beneath`]): an earlier attempt may have left links in them.
pub fn hand_over_task_dir(task_dir: &Path, user: TaskUser) -> std::io::Result<()> {
    std::fs::create_dir_all(task_dir)?;
    let task = Folder::open(task_dir)?;
    task.chown_self(0, user.gid)?;
    task.set_mode(0o750)?;
    for sub in TASK_SUBDIRS {
        let dir = task.create_dir_all(sub, 0o700)?;
        dir.chown_all(user.uid, user.gid)?;
        dir.set_mode(0o700)?;
    }
    Ok(())
}

/// After the attempt: no task uid can reach the folder any more (the next attempt may run as
/// another uid, and this uid may go to another organization's task).
pub fn seal_task_dir(task_dir: &Path) -> std::io::Result<()> {
    if task_dir.exists() {
        chown(task_dir, 0, 0)?;
        chmod(task_dir, 0o700)?;
    }
    Ok(())
}

/// Whether `/proc` hides other users' processes (`hidepid=2`/`invisible`, or `ptraceable`):
/// without it any user reads every process's command line.
pub fn proc_hides_processes() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(" - "))
        .filter(|(pre, _)| pre.split_whitespace().nth(4) == Some("/proc"))
        .filter_map(|(_, post)| post.split_whitespace().nth(2))
        .any(|opts| {
            opts.split(',').any(|o| {
                matches!(
                    o,
                    "hidepid=2" | "hidepid=invisible" | "hidepid=4" | "hidepid=ptraceable"
                )
            })
        })
}

/// Without a sandbox a task reaches its folders by their host paths, as its own uid: every
/// folder above the state folder must let others pass (`o+x`). `Err` names the first that
/// does not (a `mktemp -d` folder, the root user's home).
pub fn check_reachable_by_task_users(state_dir: &Path) -> Result<(), String> {
    let abs = std::path::absolute(state_dir).map_err(|e| e.to_string())?;
    for dir in abs.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        if meta.permissions().mode() & 0o001 == 0 {
            return Err(format!(
                "task users cannot reach their folders under {}: {} is mode {:o}, which lets no other user pass; choose a state folder elsewhere (e.g. /var/lib/autodl-agent) or install bubblewrap, whose sandbox shows tasks their folders wherever they are",
                abs.display(),
                dir.display(),
                meta.permissions().mode() & 0o7777
            ));
        }
    }
    Ok(())
}

/// Task users traverse the state folder to their own task folder but cannot list it; the
/// credential, caches and staging stay root's alone.
pub fn lock_down_state_dir(state_dir: &Path) -> std::io::Result<()> {
    chmod(state_dir, 0o711)?;
    let tasks = state_dir.join("tasks");
    std::fs::create_dir_all(&tasks)?;
    chmod(&tasks, 0o711)?;
    for private in ["cache", "staging", "outbox"] {
        let p = state_dir.join(private);
        std::fs::create_dir_all(&p)?;
        chmod(&p, 0o700)?;
    }
    // Folders of attempts cut short by a crash are closed before anything runs again.
    for e in std::fs::read_dir(&tasks)?.flatten() {
        seal_task_dir(&e.path())?;
    }
    Ok(())
}

/// Makes `target` a tree of hard links to the files of `source` (a cached dataset) that the
/// task's group can read, without giving access to the cache itself. Used where no mount
/// namespace can show the cache read-only.
pub fn link_tree(source: &Path, target: &Path, gid: u32) -> std::io::Result<()> {
    let _ = std::fs::remove_dir_all(target);
    std::fs::create_dir_all(target)?;
    for e in walkdir::WalkDir::new(source).follow_links(false) {
        let e = e.map_err(std::io::Error::other)?;
        let Ok(rel) = e.path().strip_prefix(source) else {
            continue;
        };
        let to = target.join(rel);
        if e.file_type().is_dir() {
            std::fs::create_dir_all(&to)?;
            chown(&to, 0, gid)?;
            chmod(&to, 0o750)?;
        } else if e.file_type().is_file() {
            std::fs::hard_link(e.path(), &to)
                .or_else(|_| std::fs::copy(e.path(), &to).map(|_| ()))?;
        }
    }
    Ok(())
}

/// A host data path (`data_path: /datasets/x`) resolved inside one of the node's dataset
/// roots, links included: `None` when it is outside every root or does not exist.
pub fn resolve_data_path(requested: &str, roots: &[PathBuf]) -> Option<PathBuf> {
    let p = Path::new(requested);
    if !p.is_absolute() {
        return None;
    }
    let real = std::fs::canonicalize(p).ok()?;
    roots
        .iter()
        .filter_map(|r| std::fs::canonicalize(r).ok())
        .any(|root| real.starts_with(&root))
        .then_some(real)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names() {
        assert!(is_env_name("CUDA_VISIBLE_DEVICES") && is_env_name("_x1"));
        assert!(
            !is_env_name("1A") && !is_env_name("A-B") && !is_env_name("") && !is_env_name("A B")
        );
    }

    #[test]
    fn inherited_env_is_an_allow_list() {
        let env = inherited_env();
        assert!(env.keys().all(|k| k == "PATH"
            || k == "LANG"
            || k == "LANGUAGE"
            || k == "TZ"
            || k.starts_with("LC_")));
    }

    #[test]
    fn a_state_folder_under_a_closed_folder_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let closed = d.path().join("closed");
        std::fs::create_dir_all(closed.join("state")).unwrap();
        chmod(d.path(), 0o755).unwrap();
        chmod(&closed, 0o700).unwrap();
        let why = check_reachable_by_task_users(&closed.join("state")).unwrap_err();
        assert!(why.contains("mode 700"), "{why}");
        chmod(&closed, 0o711).unwrap();
        check_reachable_by_task_users(&closed.join("state")).unwrap();
    }

    #[test]
    fn data_paths_stay_inside_their_roots() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("datasets");
        std::fs::create_dir_all(root.join("imagenet")).unwrap();
        std::fs::create_dir_all(d.path().join("secret")).unwrap();
        std::os::unix::fs::symlink(d.path().join("secret"), root.join("escape")).unwrap();
        std::os::unix::fs::symlink(root.join("imagenet"), root.join("alias")).unwrap();
        let roots = vec![root.clone()];
        let inside = root.join("imagenet").display().to_string();
        assert_eq!(
            resolve_data_path(&inside, &roots),
            Some(std::fs::canonicalize(root.join("imagenet")).unwrap())
        );
        let alias = root.join("alias").display().to_string();
        assert!(
            resolve_data_path(&alias, &roots).is_some(),
            "a link that stays inside"
        );
        for bad in [
            root.join("escape").display().to_string(),
            root.join("../secret").display().to_string(),
            d.path().join("secret").display().to_string(),
            "relative/path".to_string(),
            root.join("missing").display().to_string(),
        ] {
            assert_eq!(resolve_data_path(&bad, &roots), None, "{bad}");
        }
        assert_eq!(
            resolve_data_path(&inside, &[]),
            None,
            "no roots, no host paths"
        );
    }
}
