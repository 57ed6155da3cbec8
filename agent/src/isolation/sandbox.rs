//! The process runtime's namespaces, through bubblewrap (`bwrap`, what Flatpak uses).
//!
//! bwrap runs as root (so it can show the task folders of a root-owned state folder and any
//! read-only path the operator names) with an empty environment, builds a fresh root of
//! read-only system folders plus the task's own folder, and starts `setpriv`, which drops to
//! the task's uid with no capabilities and `no_new_privs`. Only then does a shell, now the
//! task user, read the task's environment from a file in the task folder and exec the
//! command: no program running as root ever sees a variable the task chose (`LD_PRELOAD`),
//! and the environment (the task token) never appears on a command line other tasks could
//! read.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::TaskUser;

/// System folders shown read-only (links such as `/bin -> usr/bin` are recreated as links).
const SYSTEM_PATHS: [&str; 9] = [
    "/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// NVIDIA control devices every CUDA process needs besides its own GPUs.
const NVIDIA_CONTROL: [&str; 4] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

/// Where the tools live on this host; found once at start.
#[derive(Debug, Clone)]
pub struct Sandbox {
    bwrap: PathBuf,
    setpriv: PathBuf,
    read_only: Vec<PathBuf>,
}

/// One sandboxed launch. Paths inside the sandbox are the same as in a container
/// (`/autodl/...`), so a task sees the same layout under both runtimes.
pub struct SandboxLaunch<'a> {
    pub user: TaskUser,
    /// Read-write `(host, sandbox)` folders: checkpoints, results, home.
    pub binds: Vec<(PathBuf, PathBuf)>,
    /// Read-only `(host, sandbox)` folders: a dataset, the operator's workdir.
    pub read_only: Vec<(PathBuf, PathBuf)>,
    /// The task's /tmp on the host.
    pub tmp_dir: &'a Path,
    /// Working directory, a sandbox path.
    pub workdir: &'a Path,
    /// GPU device indices to expose (real GPUs only).
    pub gpus: &'a [u32],
    /// Holds `export K='v'` lines, readable by the task's group.
    pub env_file: &'a Path,
    pub command: &'a [String],
    /// The command reads a terminal of its own (a person's shell): it keeps that terminal as
    /// its controlling one, so Ctrl-C and job control work. Without it the sandbox starts a
    /// new session, so a task cannot push keystrokes into a terminal it was handed.
    pub terminal: bool,
    /// Someone's command in a running task (a shell, or `autodl exec`), not the task's own:
    /// what it starts in the background (nohup, setsid, `&`) outlives it, as after
    /// `ssh host 'nohup x &'`: bwrap's reaper stays while they run. The attempt's end (its
    /// cgroup, its uid) ends them all.
    pub exec: bool,
    /// `/etc/passwd` and `/etc/group` that also name the task's uid
    /// ([`write_identity_files`]), so tools that look the user up (a shell's prompt,
    /// `whoami`, `getpass`, pip's user folder) find one.
    pub identity: Option<(&'a Path, &'a Path)>,
}

/// Where the environment file appears inside the sandbox.
pub const SANDBOX_ENV_FILE: &str = "/autodl/.env";

pub(crate) fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| super::DEFAULT_PATH.into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `setpriv` (util-linux), which drops a root process to a task's uid; it must be in a system
/// folder, which a sandbox shows.
pub fn find_setpriv() -> Result<PathBuf, String> {
    let setpriv = which("setpriv").ok_or("setpriv (util-linux) is not installed")?;
    if !SYSTEM_PATHS.iter().any(|s| setpriv.starts_with(s)) {
        return Err(format!(
            "setpriv at {} is outside the system folders a sandbox shows",
            setpriv.display()
        ));
    }
    Ok(setpriv)
}

impl Sandbox {
    /// Finds bwrap and setpriv and checks that a sandboxed process can start as
    /// `probe_uid`; `Err` says why not.
    pub fn detect(
        bwrap: Option<&Path>,
        read_only: &[PathBuf],
        probe_uid: u32,
    ) -> Result<Sandbox, String> {
        let bwrap = match bwrap {
            Some(p) => p.to_path_buf(),
            None => which("bwrap").ok_or("bubblewrap (bwrap) is not installed")?,
        };
        let setpriv = find_setpriv()?;
        let sb = Sandbox {
            bwrap,
            setpriv,
            read_only: read_only.to_vec(),
        };
        let dir = tempfile::Builder::new()
            .prefix("autodl-sandbox-probe")
            .tempdir()
            .map_err(|e| format!("probe folder: {e}"))?;
        let user = TaskUser {
            uid: probe_uid,
            gid: probe_uid,
        };
        let task = dir.path().join("task");
        super::hand_over_task_dir(&task, user).map_err(|e| format!("probe folder: {e}"))?;
        let env_file = task.join(".autodl-env");
        write_env_file(&env_file, user.gid, [("PATH", super::DEFAULT_PATH)])
            .map_err(|e| format!("probe env: {e}"))?;
        let cmd = vec![
            "/bin/sh".to_string(),
            "-c".into(),
            "test \"$(id -u)\" = \"$0\" && touch /autodl/home/ok".into(),
            probe_uid.to_string(),
        ];
        let launch = SandboxLaunch {
            user,
            binds: vec![(task.join("home"), PathBuf::from("/autodl/home"))],
            read_only: Vec::new(),
            tmp_dir: &task.join("tmp"),
            workdir: Path::new("/autodl/home"),
            gpus: &[],
            env_file: &env_file,
            command: &cmd,
            terminal: false,
            exec: false,
            identity: None,
        };
        let out = std::process::Command::new(&sb.bwrap)
            .args(sb.args(&launch))
            .env_clear()
            .env("PATH", super::DEFAULT_PATH)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("could not run {}: {e}", sb.bwrap.display()))?;
        if !out.status.success() || !task.join("home/ok").exists() {
            return Err(format!(
                "a sandboxed probe failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(sb)
    }

    pub fn bwrap(&self) -> &Path {
        &self.bwrap
    }

    /// bwrap's arguments for one launch.
    pub fn args(&self, l: &SandboxLaunch<'_>) -> Vec<OsString> {
        let mut a = Args::default();
        if !l.terminal {
            a.push("--new-session");
        }
        if !l.exec {
            // The task's own command ends with the agent that supervises it.
            a.push("--die-with-parent");
        }
        for flag in [
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--cap-drop",
            "ALL",
            "--cap-add",
            "CAP_SETUID",
            "--cap-add",
            "CAP_SETGID",
            "--hostname",
            "autodl-task",
            "--tmpfs",
            "/",
        ] {
            a.push(flag);
        }
        for s in SYSTEM_PATHS {
            let p = Path::new(s);
            match std::fs::symlink_metadata(p) {
                Ok(m) if m.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(p) {
                        a.push("--symlink");
                        a.push(target);
                        a.push(p);
                    }
                }
                Ok(m) if m.is_dir() => a.ro_bind(p, p),
                _ => {}
            }
        }
        if let Some((passwd, group)) = l.identity {
            a.ro_bind(passwd, Path::new("/etc/passwd"));
            a.ro_bind(group, Path::new("/etc/group"));
        }
        // A resolver configuration that links outside /etc (systemd-resolved) must follow.
        if let Ok(real) = std::fs::canonicalize("/etc/resolv.conf") {
            if !a.covered(&real) {
                a.parents(&real);
                a.ro_bind(&real, &real);
            }
        }
        a.push("--proc");
        a.push("/proc");
        a.push("--dev");
        a.push("/dev");
        if !l.gpus.is_empty() {
            let mut devs: Vec<PathBuf> = l
                .gpus
                .iter()
                .map(|i| PathBuf::from(format!("/dev/nvidia{i}")))
                .collect();
            devs.extend(NVIDIA_CONTROL.iter().map(PathBuf::from));
            devs.push(PathBuf::from("/dev/nvidia-caps"));
            for d in devs.iter().filter(|d| d.exists()) {
                a.push("--dev-bind");
                a.push(d);
                a.push(d);
            }
        }
        a.push("--ro-bind-try");
        a.push("/sys");
        a.push("/sys");
        a.dir("/tmp");
        a.push("--bind");
        a.push(l.tmp_dir);
        a.push("/tmp");
        a.dir("/var");
        a.push("--symlink");
        a.push("../tmp");
        a.push("/var/tmp");
        for p in &self.read_only {
            // Never the whole host.
            if p.is_absolute() && p.parent().is_some() && p.exists() && !a.covered(p) {
                a.parents(p);
                a.ro_bind(p, p);
            }
        }
        a.dir("/autodl");
        for (host, inside) in &l.binds {
            a.parents(inside);
            a.push("--bind");
            a.push(host);
            a.push(inside);
            a.bound.push(inside.clone());
        }
        for (host, inside) in &l.read_only {
            a.parents(inside);
            a.ro_bind(host, inside);
        }
        a.ro_bind(l.env_file, Path::new(SANDBOX_ENV_FILE));
        a.push("--");
        a.push(&self.setpriv);
        for f in [
            format!("--reuid={}", l.user.uid),
            format!("--regid={}", l.user.gid),
            "--clear-groups".into(),
            "--no-new-privs".into(),
            "--".into(),
            "/bin/sh".into(),
            "-c".into(),
            // Entered as the task user: root in the sandbox holds no capability to read
            // the task's own folders.
            format!(
                "cd {} && . {SANDBOX_ENV_FILE} && exec \"$@\"",
                sh_quote(&l.workdir.to_string_lossy())
            ),
            "autodl-task".into(),
        ] {
            a.push(f);
        }
        for c in l.command {
            a.push(c);
        }
        a.out
    }
}

#[derive(Default)]
struct Args {
    out: Vec<OsString>,
    /// Folders already mounted, inside which nothing may be created.
    bound: Vec<PathBuf>,
    made: BTreeSet<PathBuf>,
}

impl Args {
    fn push(&mut self, s: impl Into<OsString>) {
        self.out.push(s.into());
    }

    fn covered(&self, p: &Path) -> bool {
        self.bound.iter().any(|b| p.starts_with(b))
    }

    fn ro_bind(&mut self, host: &Path, inside: &Path) {
        self.push("--ro-bind");
        self.push(host);
        self.push(inside);
        self.bound.push(inside.to_path_buf());
    }

    /// A traversable folder (bwrap would copy the host's mode, e.g. /root's 0700).
    fn dir(&mut self, p: &str) {
        if self.made.insert(PathBuf::from(p)) {
            self.push("--perms");
            self.push("0755");
            self.push("--dir");
            self.push(p);
        }
    }

    fn parents(&mut self, p: &Path) {
        let mut ancestors: Vec<&Path> = p.ancestors().skip(1).collect();
        ancestors.reverse();
        for anc in ancestors {
            if anc == Path::new("/") || self.covered(anc) {
                continue;
            }
            if let Some(s) = anc.to_str() {
                self.dir(s);
            }
        }
    }
}

/// Single-quotes a value for `sh`.
pub fn sh_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', "'\\''"))
}

/// Writes the task's environment as `export` lines, readable by root and the task's group
/// only. Names a shell cannot export are left out.
/// The name a task's uid goes by inside the sandbox.
pub const TASK_USER_NAME: &str = "autodl";

/// Writes `passwd` and `group` files into `dir`: the host's entries (what `/etc` shows the
/// task anyway) and one for the task's uid, with its home in the sandbox. Returns their paths.
pub fn write_identity_files(dir: &Path, user: TaskUser) -> std::io::Result<(PathBuf, PathBuf)> {
    let host_passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let host_group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    let taken = |table: &str, name: &str| table.lines().any(|l| l.split(':').next() == Some(name));
    let name = if taken(&host_passwd, TASK_USER_NAME) || taken(&host_group, TASK_USER_NAME) {
        format!("{TASK_USER_NAME}-{}", user.uid)
    } else {
        TASK_USER_NAME.to_owned()
    };
    let mut passwd = host_passwd.trim_end().to_owned();
    passwd.push_str(&format!(
        "\n{name}:x:{}:{}:autodl task:/autodl/home:/bin/sh\n",
        user.uid, user.gid
    ));
    let mut group = host_group.trim_end().to_owned();
    group.push_str(&format!("\n{name}:x:{}:\n", user.gid));
    let files = (dir.join(".autodl-passwd"), dir.join(".autodl-group"));
    for (path, text) in [(&files.0, passwd), (&files.1, group)] {
        let _ = std::fs::remove_file(path);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(path)?;
        f.write_all(text.as_bytes())?;
    }
    Ok(files)
}

pub fn write_env_file<'a>(
    path: &Path,
    gid: u32,
    vars: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .open(path)?;
    let mut text = String::new();
    for (k, v) in vars {
        if super::is_env_name(k) && !v.contains('\0') {
            text.push_str(&format!("export {k}={}\n", sh_quote(v)));
        }
    }
    f.write_all(text.as_bytes())?;
    std::os::unix::fs::lchown(path, Some(0), Some(gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_drop_to_the_task_user_and_show_only_what_is_named() {
        let sb = Sandbox {
            bwrap: "/usr/bin/bwrap".into(),
            setpriv: "/usr/bin/setpriv".into(),
            read_only: vec![PathBuf::from("/usr/share/doc"), PathBuf::from("/")],
        };
        let task = Path::new("/var/lib/autodl-agent/tasks/t1");
        let cmd = vec!["python".to_string(), "train.py".into()];
        let env = task.join(".autodl-env");
        let l = SandboxLaunch {
            user: TaskUser {
                uid: 2_000_123,
                gid: 2_000_123,
            },
            binds: vec![
                (task.join("checkpoints"), PathBuf::from("/checkpoints")),
                (task.join("home"), PathBuf::from("/autodl/home")),
            ],
            read_only: vec![(PathBuf::from("/cache/ds"), PathBuf::from("/autodl/data"))],
            tmp_dir: &task.join("tmp"),
            workdir: Path::new("/autodl/home"),
            gpus: &[],
            env_file: &env,
            command: &cmd,
            terminal: false,
            exec: false,
            identity: None,
        };
        let args: Vec<String> = sb
            .args(&l)
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        let joined = args.join(" ");
        assert!(joined.contains("--unshare-pid") && joined.contains("--die-with-parent"));
        assert!(
            joined.contains("--new-session"),
            "a task gets no terminal to type into"
        );
        assert!(joined.contains("--cap-drop ALL"));
        assert!(joined.contains("--reuid=2000123 --regid=2000123 --clear-groups --no-new-privs"));
        assert!(joined.contains("--bind /var/lib/autodl-agent/tasks/t1/checkpoints /checkpoints"));
        assert!(joined.contains("--bind /var/lib/autodl-agent/tasks/t1/tmp /tmp"));
        assert!(joined.contains("--ro-bind /cache/ds /autodl/data"));
        assert!(
            joined.contains("--ro-bind /var/lib/autodl-agent/tasks/t1/.autodl-env /autodl/.env")
        );
        assert!(joined.contains("cd '/autodl/home' && . /autodl/.env && exec \"$@\" autodl-task"));
        assert!(
            !joined.contains("/usr/share/doc /usr/share/doc"),
            "inside /usr already"
        );
        assert!(
            !joined.contains("/run"),
            "nothing of /run (docker.sock) is shown"
        );
        assert!(
            !joined.contains("--bind / ") && !joined.contains("--ro-bind / /"),
            "never the host root"
        );
        assert!(
            !joined.contains("--bind /var/lib/autodl-agent/tasks/t1 "),
            "not the task folder itself"
        );
        assert_eq!(
            &args[args.len() - 3..],
            ["autodl-task", "python", "train.py"]
        );
        let args_of = |l: &SandboxLaunch<'_>| -> Vec<String> {
            sb.args(l)
                .into_iter()
                .map(|s| s.into_string().unwrap())
                .collect()
        };
        let exec = SandboxLaunch { exec: true, ..l };
        let args = args_of(&exec);
        assert!(
            args.contains(&"--new-session".to_string())
                && !args.contains(&"--die-with-parent".to_string()),
            "an exec's background work outlives it, on no terminal"
        );
        let shell = SandboxLaunch {
            terminal: true,
            ..exec
        };
        let args = args_of(&shell);
        assert!(
            !args.contains(&"--new-session".to_string()),
            "a person's shell keeps its terminal"
        );
    }

    /// As root (CI, `scripts/test.sh` installs bubblewrap) the sandbox must work here.
    #[test]
    fn sandbox_starts_as_root() {
        if !super::super::is_root() {
            crate::skip("the sandbox needs root");
            return;
        }
        if let Err(e) = Sandbox::detect(None, &[], 2_099_999) {
            panic!("sandbox unavailable as root: {e} (install bubblewrap)");
        }
    }

    #[test]
    fn env_file_quotes_values_and_skips_bad_names() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("env");
        write_env_file(
            &p,
            nix::unistd::getgid().as_raw(),
            [("A", "it's $HOME"), ("BAD-NAME", "x"), ("B", "two\nlines")],
        )
        .unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text, "export A='it'\\''s $HOME'\nexport B='two\nlines'\n");
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(". \"$0\" && printf '%s|%s' \"$A\" \"$B\"")
            .arg(&p)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "it's $HOME|two\nlines"
        );
    }
}
