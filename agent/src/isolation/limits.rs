//! Memory, CPU and process-count limits of process-runtime tasks, through cgroups (v2, or the
//! v1 controllers where a host still mounts those), as Docker limits its containers.
//!
//! Each attempt gets a cgroup of its own below `autodl/` in every hierarchy that holds the
//! memory, cpu and pids controllers. The task's first process joins it before anything of the
//! task runs (a root shell writes its own pid, then execs the sandbox), so nothing the task
//! forks can be left outside. When the attempt ends every process in it is killed and the
//! cgroup removed; an out-of-memory kill is read from the cgroup's own counters.
//!
//! Written by hand rather than with `cgroups-rs`: that crate pulls a D-Bus stack (zbus) in for
//! its systemd backend, and what is needed here is a handful of files.

use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The folder below each hierarchy's root that holds the tasks' cgroups.
const BASE: &str = "autodl";

/// What one attempt may use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Bytes of RAM; `None`: no limit.
    pub memory: Option<u64>,
    /// Cores; `None`: no limit.
    pub cpu: Option<f64>,
    /// Most processes and threads.
    pub pids: u64,
}

#[derive(Debug, Clone)]
enum Hierarchy {
    /// The unified hierarchy, mounted here.
    V2(PathBuf),
    /// v1 mounts of the memory, cpu and pids controllers.
    V1 {
        memory: PathBuf,
        cpu: PathBuf,
        pids: PathBuf,
        /// Freezes a cgroup so that killing what is in it races no fork.
        freezer: Option<PathBuf>,
    },
}

/// How this host limits tasks; found once at start.
#[derive(Debug, Clone)]
pub struct Limiter {
    hierarchy: Hierarchy,
}

/// One attempt's cgroup (one folder per v1 hierarchy). Dropping it kills what is left in it
/// and removes it.
#[derive(Debug)]
pub struct TaskCgroup {
    dirs: Vec<PathBuf>,
    v2: bool,
}

/// `(mount point, file system type, super options)` of each mount.
fn mounts() -> Vec<(PathBuf, String, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let mount_point = pre.split_whitespace().nth(4)?;
            let mut post = post.split_whitespace();
            let fstype = post.next()?.to_owned();
            let _source = post.next();
            let options = post.next().unwrap_or_default().to_owned();
            Some((PathBuf::from(unescape(mount_point)), fstype, options))
        })
        .collect()
}

/// mountinfo writes spaces and the like as octal escapes.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(char::from(v));
                i += 4;
                continue;
            }
        }
        out.push(char::from(b[i]));
        i += 1;
    }
    out
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

impl Limiter {
    /// The hierarchy that can limit memory, CPU and processes here; `Err` says why none can.
    pub fn detect() -> Result<Limiter, String> {
        let mounts = mounts();
        let v2 = mounts
            .iter()
            .find(|(_, fs, _)| fs == "cgroup2")
            .map(|(p, _, _)| p.clone());
        if let Some(root) = &v2 {
            let controllers =
                std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
            if has("memory") && has("pids") && has("cpu") {
                let l = Limiter {
                    hierarchy: Hierarchy::V2(root.clone()),
                };
                l.prepare_v2(root)?;
                return Ok(l);
            }
        }
        let v1 = |controller: &str| {
            mounts
                .iter()
                .find(|(_, fs, opts)| fs == "cgroup" && opts.split(',').any(|o| o == controller))
                .map(|(p, _, _)| p.clone())
        };
        match (v1("memory"), v1("cpu"), v1("pids")) {
            (Some(memory), Some(cpu), Some(pids)) => {
                let freezer = v1("freezer");
                for root in [&memory, &cpu, &pids].into_iter().chain(freezer.as_ref()) {
                    std::fs::create_dir_all(root.join(BASE))
                        .map_err(|e| format!("cannot make cgroups in {}: {e}", root.display()))?;
                }
                Ok(Limiter {
                    hierarchy: Hierarchy::V1 {
                        memory,
                        cpu,
                        pids,
                        freezer,
                    },
                })
            }
            _ => Err(match v2 {
                Some(root) => format!(
                    "the cgroup v2 hierarchy at {} offers no memory, cpu and pids controllers",
                    root.display()
                ),
                None => "no cgroup hierarchy with the memory, cpu and pids controllers is mounted"
                    .into(),
            }),
        }
    }

    /// Enables the three controllers for the tasks' folder (the root cgroup may hold
    /// processes and still delegate; `autodl/` holds none of its own).
    fn prepare_v2(&self, root: &Path) -> Result<(), String> {
        let enable = "+memory +pids +cpu";
        write(&root.join("cgroup.subtree_control"), enable)
            .map_err(|e| format!("cannot enable the controllers: {e}"))?;
        let base = root.join(BASE);
        std::fs::create_dir_all(&base).map_err(|e| format!("{}: {e}", base.display()))?;
        write(&base.join("cgroup.subtree_control"), enable)
            .map_err(|e| format!("cannot enable the controllers: {e}"))
    }

    /// For the node's page: how tasks are limited.
    pub fn describe(&self) -> String {
        match &self.hierarchy {
            Hierarchy::V2(_) => "cgroup v2: memory, cpu, pids".into(),
            Hierarchy::V1 { freezer, .. } => format!(
                "cgroup v1: memory, cpu, pids{}",
                if freezer.is_some() { ", freezer" } else { "" }
            ),
        }
    }

    /// A fresh cgroup named `name` (a leftover of that name, from an agent that died, is
    /// emptied and replaced) with `limits` applied.
    pub fn create(&self, name: &str, limits: &Limits) -> io::Result<TaskCgroup> {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(io::Error::new(ErrorKind::InvalidInput, "bad cgroup name"));
        }
        let cg = match &self.hierarchy {
            Hierarchy::V2(root) => TaskCgroup {
                dirs: vec![root.join(BASE).join(name)],
                v2: true,
            },
            Hierarchy::V1 {
                memory,
                cpu,
                pids,
                freezer,
            } => TaskCgroup {
                dirs: [memory, cpu, pids]
                    .into_iter()
                    .chain(freezer.as_ref())
                    .map(|r| r.join(BASE).join(name))
                    .collect(),
                v2: false,
            },
        };
        cg.remove();
        for d in &cg.dirs {
            std::fs::create_dir(d)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", d.display())))?;
        }
        if let Err(e) = cg.apply(limits) {
            cg.remove();
            return Err(e);
        }
        Ok(cg)
    }
}

/// Microseconds of CPU per 100 ms period for `cores`.
fn quota_us(cores: f64) -> u64 {
    ((cores * 100_000.0).round() as u64).max(1_000)
}

impl TaskCgroup {
    fn apply(&self, l: &Limits) -> io::Result<()> {
        if self.v2 {
            let d = &self.dirs[0];
            if let Some(m) = l.memory {
                write(&d.join("memory.max"), &m.to_string())?;
                // Past its limit a task is killed, not swapped to death.
                if d.join("memory.swap.max").exists() {
                    write(&d.join("memory.swap.max"), "0")?;
                }
            }
            if let Some(c) = l.cpu {
                write(&d.join("cpu.max"), &format!("{} 100000", quota_us(c)))?;
            }
            write(&d.join("pids.max"), &l.pids.to_string())?;
        } else {
            let (memory, cpu, pids) = (&self.dirs[0], &self.dirs[1], &self.dirs[2]);
            if let Some(m) = l.memory {
                write(&memory.join("memory.limit_in_bytes"), &m.to_string())?;
                let swap = memory.join("memory.memsw.limit_in_bytes");
                if swap.exists() {
                    write(&swap, &m.to_string())?;
                }
            }
            if let Some(c) = l.cpu {
                write(&cpu.join("cpu.cfs_period_us"), "100000")?;
                write(&cpu.join("cpu.cfs_quota_us"), &quota_us(c).to_string())?;
            }
            write(&pids.join("pids.max"), &l.pids.to_string())?;
        }
        Ok(())
    }

    /// The files a process writes its pid to, to join this cgroup.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Processes the kernel killed for running out of memory in this cgroup.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            self.dirs[0].join("memory.events")
        } else {
            self.dirs[0].join("memory.oom_control")
        };
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The processes in the cgroup.
    pub fn pids(&self) -> Vec<i32> {
        let mut out: Vec<i32> = self
            .procs_files()
            .iter()
            .flat_map(|f| {
                std::fs::read_to_string(f)
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Sends `sig` to every process in the cgroup; returns how many there were.
    pub fn signal(&self, sig: Signal) -> usize {
        self.pids()
            .into_iter()
            .filter(|p| *p > 0 && kill(Pid::from_raw(*p), sig).is_ok())
            .count()
    }

    /// Processes and threads the pids controller still counts: a killed process counts until
    /// whoever adopted it has reaped it.
    fn counted(&self) -> u64 {
        let dir = if self.v2 {
            &self.dirs[0]
        } else {
            &self.dirs[2]
        };
        std::fs::read_to_string(dir.join("pids.current"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Kills every process in the cgroup, forks included, and waits (a few seconds at most)
    /// until none is left, reaped ones included. Returns whether it is empty.
    pub fn kill_all(&self) -> bool {
        if self.v2 {
            let _ = std::fs::write(self.dirs[0].join("cgroup.kill"), "1");
        } else if let Some(freezer) = self.dirs.get(3) {
            // Frozen, nothing in it forks while it is killed.
            let state = freezer.join("freezer.state");
            if std::fs::write(&state, "FROZEN").is_ok() {
                let until = std::time::Instant::now() + Duration::from_secs(2);
                while std::fs::read_to_string(&state).is_ok_and(|s| s.trim() != "FROZEN")
                    && std::time::Instant::now() < until
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                self.signal(Signal::SIGKILL);
                let _ = std::fs::write(&state, "THAWED");
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            if self.signal(Signal::SIGKILL) == 0 && self.counted() == 0 {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn remove(&self) {
        if self.dirs.iter().any(|d| d.exists()) {
            self.kill_all();
            for d in &self.dirs {
                let _ = std::fs::remove_dir(d);
            }
        }
    }
}

impl Drop for TaskCgroup {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The shell that moves itself into the cgroups named before `--`, then execs the rest. Run
/// as root with an empty environment: nothing of the task reaches it.
pub const JOIN_SCRIPT: &str =
    "while [ \"$1\" != -- ]; do echo $$ > \"$1\" || exit 125; shift; done; shift; exec \"$@\"";

/// The exit status of the joining shell when it could not join.
pub const JOIN_FAILED: i32 = 125;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }

    #[test]
    fn quotas() {
        assert_eq!(quota_us(1.5), 150_000);
        assert_eq!(quota_us(0.0001), 1_000);
    }

    /// As root (CI) the host must be able to limit tasks, and a limited task is held to its
    /// limits: memory (killed, and the kill counted), processes and CPU.
    #[test]
    fn a_task_is_held_to_its_limits() {
        if !crate::isolation::is_root() {
            crate::skip("cgroups need root (CI runs the suite as root)");
            return;
        }
        let limiter = Limiter::detect().expect("cgroups as root");
        let cg = limiter
            .create(
                "unit-test-limits",
                &Limits {
                    memory: Some(64 << 20),
                    cpu: Some(0.5),
                    pids: 20,
                },
            )
            .unwrap();
        let run = |script: &str| {
            let mut args = vec!["-c".to_string(), JOIN_SCRIPT.into(), "join".into()];
            args.extend(cg.procs_files().iter().map(|p| p.display().to_string()));
            args.extend(["--".into(), "/bin/sh".into(), "-c".into(), script.into()]);
            std::process::Command::new("/bin/sh")
                .args(&args)
                .env_clear()
                .output()
                .unwrap()
        };
        let out = run("for i in $(seq 1 40); do sleep 2 & done; echo started; wait");
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(
            text.contains("fork") || text.contains("Resource temporarily unavailable"),
            "a 41st process was allowed: {text}"
        );
        assert!(cg.kill_all(), "what the shell left running is killed");
        let before = cg.oom_kills();
        let out = run("python3 -c 'x = bytearray(256 << 20); print(len(x))'");
        assert!(!out.status.success(), "256 MiB in a 64 MiB cgroup");
        assert!(
            cg.oom_kills() > before,
            "the kill is counted: {out:?} {before} {}",
            cg.oom_kills()
        );
        assert!(cg.kill_all());
    }
}
