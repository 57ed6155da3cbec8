//! Task environments: what a task's `setup` commands and `requirements` file make, built
//! once on a node and reused, as SkyPilot's `setup:` and dstack's pip environments are.
//!
//! An environment is a folder, `<state>/envs/<key>`, that the task sees at
//! [`CONTAINER_ENV_DIR`] (`$AUTODL_ENV_DIR`): a virtualenv made from the task's own Python
//! (whose packages stay importable), with the requirements installed, then whatever `setup`
//! adds to it. It is built by the task's runtime, as the task's user and in its sandbox or
//! container, with only that folder writable, its output in the task's log; then it is given
//! to the agent and shown read-only to every attempt and task with the same key.
//!
//! The key covers the organization (a tenant's setup runs its code: what it leaves is never
//! handed to another organization), the image, the setup script, and the requirements file
//! with the local files it names, so a change to any of them builds a new environment.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use autodl_common::agent::EnvironmentSpec;
use sha2::{Digest, Sha256};
use tokio::sync::{oneshot, watch};

use crate::beneath::Folder;
use crate::logs::LogBuffer;
use crate::protocol::Stream;
use crate::runtime::{EnvDir, Runtime, TaskIo, TaskLaunch};

/// Environments unused for this long are removed when another one is built.
pub const UNUSED_FOR: Duration = Duration::from_secs(14 * 86_400);
/// The largest environment a build may leave.
pub const MAX_ENV_BYTES: u64 = 20 << 30;
/// Environments an organization keeps on a node at most; the least recently used go first.
pub const MAX_ENVS_PER_SCOPE: usize = 16;
/// The share of the node's disk its environments may take together.
const DISK_SHARE: f64 = 0.25;

/// The largest requirements file read, and the most local files it may name.
const MAX_REQUIREMENTS: u64 = 1 << 20;
const MAX_LOCAL_FILES: usize = 64;

/// Builds the environment in the task's runtime, with `$AUTODL_ENV_DIR` writable. The
/// virtualenv sees the packages of the Python it is made from (`--system-site-packages`
/// for the interpreter's, a `.pth` file adding those of a virtualenv it may itself be, as the
/// demo's is, with their own `.pth` files: editable installs), so an image's torch or the SDK
/// are not installed again.
const BUILD_SCRIPT: &str = r#"set -e
umask 022
E="$AUTODL_ENV_DIR"
PY=""
for p in python3 python; do
  if command -v "$p" >/dev/null 2>&1; then PY="$(command -v "$p")"; break; fi
done
if [ -n "$PY" ]; then
  echo "[autodl-env] virtualenv from $PY ($("$PY" -V 2>&1))"
  if ! "$PY" -m venv --system-site-packages "$E"; then
    echo "[autodl-env] $PY could not make a virtualenv (Debian: apt install python3-venv)" >&2
    exit 1
  fi
  SITE="$("$E/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  "$PY" -c 'import site; print("\n".join("import site; site.addsitedir(%r)" % p for p in site.getsitepackages()))' > "$SITE/_autodl_base.pth" || true
  VIRTUAL_ENV="$E"; export VIRTUAL_ENV
else
  mkdir -p "$E/bin"
fi
PATH="$E/bin:$PATH"; export PATH
if [ -n "$AUTODL_REQUIREMENTS" ]; then
  if [ -z "$PY" ]; then
    echo "[autodl-env] no python3 or python in the image to install $AUTODL_REQUIREMENTS with" >&2
    exit 1
  fi
  echo "[autodl-env] pip install -r $AUTODL_REQUIREMENTS"
  python -m pip install --disable-pip-version-check --no-input --progress-bar off -r "$AUTODL_REQUIREMENTS"
fi
if [ -n "$AUTODL_SETUP" ]; then
  echo "[autodl-env] setup"
  /bin/sh -e -c "$AUTODL_SETUP"
fi
"#;

#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("{0}")]
    Input(String),
    #[error("could not prepare the environment folder: {0}")]
    Io(#[from] std::io::Error),
    #[error("the environment could not be built: {0}")]
    Build(String),
    #[error("stopped while the environment was built")]
    Stopped,
}

impl EnvError {
    /// Not the task's fault: it may start elsewhere or later.
    pub fn transient(&self) -> bool {
        matches!(self, EnvError::Stopped | EnvError::Io(_))
    }
}

/// The node's environments.
pub struct Environments {
    root: PathBuf,
    /// One build of a key at a time; how many attempts use each environment now.
    keys: Mutex<HashMap<String, KeyState>>,
}

#[derive(Default)]
struct KeyState {
    build: Arc<tokio::sync::Mutex<()>>,
    users: usize,
}

/// An environment ready for an attempt; kept from removal while held.
pub struct EnvLease {
    envs: Arc<Environments>,
    key: String,
    pub dir: PathBuf,
}

impl Drop for EnvLease {
    fn drop(&mut self) {
        if let Some(k) = lock(&self.envs.keys).get_mut(&self.key) {
            k.users = k.users.saturating_sub(1);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Environments {
    pub fn new(state_dir: &Path) -> Arc<Environments> {
        Arc::new(Environments {
            // Absolute: mounted into sandboxes and containers.
            root: std::path::absolute(state_dir)
                .unwrap_or_else(|_| state_dir.to_path_buf())
                .join("envs"),
            keys: Mutex::new(HashMap::new()),
        })
    }

    /// The key of `spec` for a task of `image` whose code is unpacked in `code_dir`.
    pub fn key(
        spec: &EnvironmentSpec,
        image: &str,
        code_dir: Option<&Path>,
    ) -> Result<String, EnvError> {
        let mut h = Sha256::new();
        let env = spec.env.iter().flat_map(|(k, v)| [k.as_str(), v.as_str()]);
        for part in [
            "autodl-env-2",
            &spec.scope,
            image,
            spec.setup.as_deref().unwrap_or_default(),
            spec.requirements.as_deref().unwrap_or_default(),
        ]
        .into_iter()
        .chain(env)
        {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        if let Some(rel) = &spec.requirements {
            let missing = || {
                EnvError::Input(format!(
                    "requirements: {rel} is not a file in the task's code"
                ))
            };
            let code = Folder::open(code_dir.ok_or_else(missing)?).map_err(|_| missing())?;
            // Read beneath the code folder, following no link: the bundle is the tenant's.
            let text = code.read_small(rel, MAX_REQUIREMENTS).map_err(|e| {
                if e.kind() == std::io::ErrorKind::InvalidData {
                    EnvError::Input(format!("requirements: {e}"))
                } else {
                    missing()
                }
            })?;
            h.update(&text);
            // pip reads the paths in the file from beside it.
            let beside = rel.rsplit_once('/').map_or("", |(dir, _)| dir);
            for local in local_files(&String::from_utf8_lossy(&text)) {
                let local = if beside.is_empty() {
                    local
                } else {
                    format!("{beside}/{local}")
                };
                if let Ok((mut f, _)) = code.open_file(&local) {
                    h.update(local.as_bytes());
                    let mut file = Sha256::new();
                    let mut buf = vec![0u8; 1 << 16];
                    loop {
                        let n = f.read(&mut buf)?;
                        if n == 0 {
                            break;
                        }
                        file.update(&buf[..n]);
                    }
                    h.update(file.finalize());
                }
            }
        }
        Ok(hex::encode(&h.finalize()[..16]))
    }

    /// The environment of `launch` (which must have `environment`), built by `runtime` unless
    /// a build of the same key is ready. Its output goes to `log`, each step of it to
    /// `steps` (for the task's timeline); `stop` ends a build.
    pub async fn prepare(
        self: &Arc<Self>,
        runtime: &dyn Runtime,
        launch: &TaskLaunch,
        log: &Arc<LogBuffer>,
        steps: &tokio::sync::mpsc::UnboundedSender<String>,
        stop: watch::Receiver<Option<Duration>>,
    ) -> Result<EnvLease, EnvError> {
        let result = self.prepare_logged(runtime, launch, log, steps, stop).await;
        if let Err(e) = &result {
            let _ = steps.send(e.to_string());
        }
        result
    }

    async fn prepare_logged(
        self: &Arc<Self>,
        runtime: &dyn Runtime,
        launch: &TaskLaunch,
        log: &Arc<LogBuffer>,
        steps: &tokio::sync::mpsc::UnboundedSender<String>,
        stop: watch::Receiver<Option<Duration>>,
    ) -> Result<EnvLease, EnvError> {
        let spec = launch
            .environment
            .clone()
            .ok_or_else(|| EnvError::Input("the task asked for no environment".into()))?;
        let code = launch.has_code.then(|| launch.code_dir());
        let image = launch.image.clone();
        let key = {
            let spec = spec.clone();
            tokio::task::spawn_blocking(move || Self::key(&spec, &image, code.as_deref()))
                .await
                .map_err(|e| EnvError::Io(std::io::Error::other(e)))??
        };
        let build = {
            let mut keys = lock(&self.keys);
            let k = keys.entry(key.clone()).or_default();
            k.users += 1;
            k.build.clone()
        };
        let lease = EnvLease {
            envs: self.clone(),
            key: key.clone(),
            dir: self.root.join(&key),
        };
        // Another attempt may be building it: wait, unless this one is stopped meanwhile.
        let _building = {
            let mut stop = stop.clone();
            tokio::select! {
                g = build.lock() => g,
                _ = stop.wait_for(Option::is_some) => return Err(EnvError::Stopped),
            }
        };
        let ready = self.root.join(format!("{key}.ready"));
        if ready.is_file() && lease.dir.is_dir() {
            // Used now: kept from removal for another `UNUSED_FOR`.
            let _ = std::fs::File::options()
                .append(true)
                .open(&ready)
                .and_then(|f| f.set_modified(SystemTime::now()));
            let said = format!("environment {} reused", &key[..12]);
            let _ = steps.send(said.clone());
            log.push(Stream::Stdout, format!("[autodl-agent] {said}"));
            return Ok(lease);
        }
        let t = Instant::now();
        let said = format!("environment {} building: {}", &key[..12], what(&spec));
        let _ = steps.send(said.clone());
        log.push(Stream::Stdout, format!("[autodl-agent] {said}"));
        std::fs::create_dir_all(&self.root)?;
        set_mode(&self.root, 0o711)?;
        // Room first: what nobody uses goes before the node's disk is short.
        self.remove_unused(&key, &spec.scope);
        let free = free_bytes(&self.root)?;
        if free < MAX_ENV_BYTES / 4 {
            // Another node may have room: not the task's fault.
            return Err(EnvError::Io(std::io::Error::other(format!(
                "the node's disk has {:.1} GB free, too little to build an environment",
                free as f64 / 1e9
            ))));
        }
        self.remove_env(&key);
        let dir = match std::fs::create_dir(&lease.dir) {
            Ok(()) => Folder::open(&lease.dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(EnvError::Build(
                    "what an earlier build left could not be removed (see the agent's log)".into(),
                ))
            }
            Err(e) => return Err(e.into()),
        };
        dir.set_mode(0o755)?;
        if let Some(u) = launch.user {
            // A folder the agent has just made, that no task has seen yet.
            dir.chown_self(u.uid, u.gid)?;
        }
        let mut b = launch.clone();
        b.command = ["/bin/sh", "-c", BUILD_SCRIPT].map(String::from).to_vec();
        b.workers = Vec::new();
        b.rank = None;
        b.rendezvous_timeout = None;
        b.env.insert(
            "AUTODL_SETUP".into(),
            spec.setup.clone().unwrap_or_default(),
        );
        b.env.insert(
            "AUTODL_REQUIREMENTS".into(),
            spec.requirements.clone().unwrap_or_default(),
        );
        b.env_dir = Some(EnvDir {
            host: lease.dir.clone(),
            writable: true,
        });
        let (started, _) = oneshot::channel();
        let outcome = runtime
            .run(
                b,
                TaskIo {
                    output: log.clone(),
                    started,
                    stop: stop.clone(),
                },
            )
            .await;
        let failed = match outcome {
            Ok(o) if o.stopped || stop.borrow().is_some() => Some(EnvError::Stopped),
            Ok(o) if o.exit_code == 0 => None,
            Ok(o) if o.oom_killed => Some(EnvError::Build(
                "out of memory (the build has the task's memory limit)".into(),
            )),
            Ok(o) => Some(EnvError::Build(format!(
                "exit code {} (its output is above)",
                o.exit_code
            ))),
            Err(e) => Some(EnvError::Build(e.to_string())),
        };
        let settled = match failed {
            Some(e) => Err(e),
            None => {
                let user = launch.user.map(|u| u.uid);
                tokio::task::spawn_blocking(move || settle(dir, user))
                    .await
                    .map_err(|e| EnvError::Io(std::io::Error::other(e)))?
            }
        };
        let bytes = match settled {
            Ok(bytes) => bytes,
            Err(e) => {
                self.remove_env(&key);
                return Err(e);
            }
        };
        std::fs::write(
            &ready,
            format!(
                "{}\n{bytes}\n{:.1}\n",
                spec.scope,
                t.elapsed().as_secs_f64()
            ),
        )?;
        let said = format!(
            "environment {} built in {:.1} s ({:.0} MB)",
            &key[..12],
            t.elapsed().as_secs_f64(),
            bytes as f64 / 1e6
        );
        let _ = steps.send(said.clone());
        log.push(Stream::Stdout, format!("[autodl-agent] {said}"));
        drop(_building);
        self.remove_unused(&key, &spec.scope);
        Ok(lease)
    }

    /// Removes a key's folder and marker. `remove_dir_all` follows no link.
    fn remove_env(&self, key: &str) {
        let _ = std::fs::remove_file(self.root.join(format!("{key}.ready")));
        let dir = self.root.join(key);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(env = key, error = %e, "could not remove an environment");
            }
        }
    }

    /// Removes the environments no attempt uses or builds (never `keep`): those unused for
    /// [`UNUSED_FOR`], what failed builds left, then the least recently used while the
    /// organization `scope` keeps more than [`MAX_ENVS_PER_SCOPE`] or all of them take more
    /// than their share of the disk.
    fn remove_unused(&self, keep: &str, scope: &str) {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        let now = SystemTime::now();
        let mut found: Vec<Kept> = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let key = name.strip_suffix(".ready").unwrap_or(&name).to_owned();
            if !key.bytes().all(|b| b.is_ascii_hexdigit()) || key.len() != 32 {
                continue;
            }
            if !seen.insert(key.clone()) {
                continue;
            }
            let ready = self.root.join(format!("{key}.ready"));
            let marker = std::fs::read_to_string(&ready).ok();
            let used = std::fs::metadata(&ready).and_then(|m| m.modified()).ok();
            let mut lines = marker.as_deref().unwrap_or_default().lines();
            found.push(Kept {
                scope: lines.next().unwrap_or_default().to_owned(),
                bytes: lines.next().and_then(|b| b.parse().ok()).unwrap_or(0),
                idle: used.map(|t| now.duration_since(t).unwrap_or_default()),
                key,
            });
        }
        // The least recently used first; what has no marker (a failed build) before all.
        found.sort_by(|a, b| {
            b.idle
                .unwrap_or(Duration::MAX)
                .cmp(&a.idle.unwrap_or(Duration::MAX))
        });
        let budget = (disk_bytes(&self.root) as f64 * DISK_SHARE) as u64;
        let mut total: u64 = found.iter().map(|k| k.bytes).sum();
        let mut of_scope = found.iter().filter(|k| k.scope == scope).count();
        for k in &found {
            if k.key == keep {
                continue;
            }
            let stale = k.idle.is_none_or(|idle| idle > UNUSED_FOR);
            let crowded = k.scope == scope && of_scope > MAX_ENVS_PER_SCOPE;
            if !(stale || crowded || total > budget) {
                continue;
            }
            // Held while it goes: no attempt can start using or building it meanwhile.
            let Some(_guard) = self.idle(&k.key) else {
                continue;
            };
            self.remove_env(&k.key);
            total = total.saturating_sub(k.bytes);
            if k.scope == scope {
                of_scope = of_scope.saturating_sub(1);
            }
        }
    }

    /// The build lock of `key` when no attempt uses or builds it.
    fn idle(&self, key: &str) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        let keys = lock(&self.keys);
        match keys.get(key) {
            Some(k) if k.users > 0 => None,
            Some(k) => k.build.clone().try_lock_owned().ok(),
            None => Some(
                Arc::new(tokio::sync::Mutex::new(()))
                    .try_lock_owned()
                    .ok()?,
            ),
        }
    }
}

/// An environment found on disk.
struct Kept {
    key: String,
    scope: String,
    bytes: u64,
    /// Since its last use; `None`: never ready.
    idle: Option<Duration>,
}

/// After a successful build, with nothing of the build left running: the folder becomes the
/// agent's, so no later task, whatever its uid, can change it; it must hold no file linked
/// from elsewhere, nothing others may write, no set-id program, and fit [`MAX_ENV_BYTES`].
/// Returns its size.
fn settle(dir: Folder, user: Option<u32>) -> Result<u64, EnvError> {
    if let Some(uid) = user {
        // Where no pid namespace ended them with the build (a task uid without a sandbox).
        crate::isolation::uids::kill_all(uid);
        let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
        dir.chown_all(uid.as_raw(), gid.as_raw())
            .map_err(|e| EnvError::Build(format!("the environment could not be kept: {e}")))?;
    }
    use std::os::unix::fs::MetadataExt;
    let mut bytes = 0u64;
    let mut skipped = None;
    dir.visit(
        &mut |path, meta| {
            bytes += meta.len();
            if bytes > MAX_ENV_BYTES {
                return Err(std::io::Error::other(format!(
                    "the environment is larger than the node's limit of {} GB",
                    MAX_ENV_BYTES >> 30
                )));
            }
            let linked = !meta.is_dir() && meta.nlink() > 1;
            // Others may write it, or it runs as its owner (set-id).
            let open = !meta.file_type().is_symlink() && meta.mode() & 0o6022 != 0;
            if linked || open {
                return Err(std::io::Error::other(format!(
                    "{path} in the environment is {}",
                    if linked {
                        "linked from elsewhere"
                    } else {
                        "writable by others or set-id"
                    }
                )));
            }
            Ok(())
        },
        &mut |p| {
            skipped.get_or_insert_with(|| p.to_owned());
        },
    )
    .map_err(|e| EnvError::Build(e.to_string()))?;
    if let Some(p) = skipped {
        return Err(EnvError::Build(format!(
            "{p} in the environment has a name that is not UTF-8 or is nested too deep"
        )));
    }
    Ok(bytes)
}

fn free_bytes(p: &Path) -> std::io::Result<u64> {
    let s = nix::sys::statvfs::statvfs(p).map_err(std::io::Error::from)?;
    Ok(s.blocks_available() * s.fragment_size())
}

fn disk_bytes(p: &Path) -> u64 {
    nix::sys::statvfs::statvfs(p)
        .map(|s| s.blocks() * s.fragment_size())
        .unwrap_or(u64::MAX)
}

fn set_mode(p: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
}

/// What a build installs, for the log.
fn what(spec: &EnvironmentSpec) -> String {
    let mut parts = Vec::new();
    if let Some(r) = &spec.requirements {
        parts.push(format!("pip install -r {r}"));
    }
    if let Some(s) = &spec.setup {
        let lines = s.lines().filter(|l| !l.trim().is_empty()).count();
        parts.push(format!(
            "setup ({lines} line{})",
            if lines == 1 { "" } else { "s" }
        ));
    }
    parts.join(", then ")
}

/// The files of the task's code a requirements file names (`./wheels/x.whl`, `-r dev.txt`,
/// `-c constraints.txt`): what pip reads besides the file itself, so a changed wheel builds
/// a new environment. Folders (`-e .`) are not followed.
fn local_files(requirements: &str) -> Vec<String> {
    requirements
        .lines()
        .filter_map(|l| {
            let l = l.split(" #").next().unwrap_or_default().trim();
            if l.is_empty() || l.starts_with('#') {
                return None;
            }
            let last = l.split_whitespace().last()?;
            let p = last.strip_prefix("./").unwrap_or(last);
            crate::beneath::is_plain_relative(p).then(|| p.to_owned())
        })
        .take(MAX_LOCAL_FILES)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(setup: Option<&str>, requirements: Option<&str>) -> EnvironmentSpec {
        EnvironmentSpec {
            scope: "org-a".into(),
            setup: setup.map(String::from),
            requirements: requirements.map(String::from),
            env: Default::default(),
        }
    }

    #[test]
    fn the_key_changes_with_everything_the_environment_is_made_of() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("wheels")).unwrap();
        std::fs::write(
            d.path().join("requirements.txt"),
            "numpy==2.1\n./wheels/a.whl\n",
        )
        .unwrap();
        std::fs::write(d.path().join("wheels/a.whl"), "one").unwrap();
        let s = spec(Some("pip install -e ."), Some("requirements.txt"));
        let k = Environments::key(&s, "img", Some(d.path())).unwrap();
        assert_eq!(k.len(), 32);
        assert_eq!(k, Environments::key(&s, "img", Some(d.path())).unwrap());
        let other_org = EnvironmentSpec {
            scope: "org-b".into(),
            ..s.clone()
        };
        for (what, other) in [
            (
                "organization",
                Environments::key(&other_org, "img", Some(d.path())),
            ),
            ("image", Environments::key(&s, "img2", Some(d.path()))),
            (
                "variables",
                Environments::key(
                    &EnvironmentSpec {
                        env: [("PIP_INDEX_URL".into(), "https://mirror".into())].into(),
                        ..s.clone()
                    },
                    "img",
                    Some(d.path()),
                ),
            ),
            (
                "setup",
                Environments::key(
                    &spec(Some("true"), Some("requirements.txt")),
                    "img",
                    Some(d.path()),
                ),
            ),
        ] {
            assert_ne!(k, other.unwrap(), "{what}");
        }
        std::fs::write(d.path().join("wheels/a.whl"), "two").unwrap();
        let k2 = Environments::key(&s, "img", Some(d.path())).unwrap();
        assert_ne!(k, k2, "a local wheel it names");
        std::fs::write(
            d.path().join("requirements.txt"),
            "numpy==2.2\n./wheels/a.whl\n",
        )
        .unwrap();
        assert_ne!(k2, Environments::key(&s, "img", Some(d.path())).unwrap());
    }

    #[test]
    fn a_requirements_file_must_be_a_file_of_the_code() {
        let d = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("requirements.txt")).unwrap();
        let s = spec(None, Some("requirements.txt"));
        for code in [Some(d.path()), None] {
            let e = Environments::key(&s, "img", code).unwrap_err();
            assert!(
                e.to_string().contains("not a file in the task's code"),
                "{e}"
            );
        }
    }

    #[test]
    fn unused_environments_go_oldest_first_beyond_an_organization_s_share() {
        let d = tempfile::tempdir().unwrap();
        let envs = Environments::new(d.path());
        std::fs::create_dir_all(&envs.root).unwrap();
        let now = SystemTime::now();
        let key = |i: usize| format!("{i:032x}");
        let make = |i: usize, scope: &str, idle_days: u64| {
            std::fs::create_dir(envs.root.join(key(i))).unwrap();
            let ready = envs.root.join(format!("{}.ready", key(i)));
            std::fs::write(&ready, format!("{scope}\n1000\n1.0\n")).unwrap();
            std::fs::File::options()
                .append(true)
                .open(&ready)
                .unwrap()
                .set_modified(now - Duration::from_secs(idle_days * 86_400 + i as u64))
                .unwrap();
        };
        // Org a: 18 environments, the higher the number the longer unused; org b: one
        // unused for a month, one recent.
        for i in 0..18 {
            make(i, "a", 0);
        }
        make(100, "b", 30);
        make(101, "b", 1);
        // A failed build's leftover (no marker).
        std::fs::create_dir(envs.root.join(key(200))).unwrap();
        // One in use is kept whatever its age (and counts among the 16).
        lock(&envs.keys).entry(key(17)).or_default().users = 1;
        envs.remove_unused(&key(0), "a");
        let left: std::collections::BTreeSet<String> = std::fs::read_dir(&envs.root)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".ready"))
            .collect();
        let expect: std::collections::BTreeSet<String> =
            (0..15).chain([17, 101]).map(key).collect();
        assert_eq!(left, expect);
    }

    #[test]
    fn local_files_are_what_pip_reads_from_the_code() {
        assert_eq!(
            local_files(
                "# c\nnumpy>=2\n-r dev.txt\n./wheels/x.whl # pinned\n-e .\n../up.txt\n/abs.whl\n"
            ),
            vec!["numpy>=2", "dev.txt", "wheels/x.whl"]
        );
    }
}
