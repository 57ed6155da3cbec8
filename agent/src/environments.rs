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
    pub key: String,
    pub dir: PathBuf,
    /// True when an earlier build was reused.
    pub reused: bool,
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
        for part in [
            "autodl-env-1",
            &spec.scope,
            image,
            spec.setup.as_deref().unwrap_or_default(),
            spec.requirements.as_deref().unwrap_or_default(),
        ] {
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
            for local in local_files(&String::from_utf8_lossy(&text)) {
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
        let key = Self::key(&spec, &launch.image, code.as_deref())?;
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
            reused: true,
        };
        let _building = build.lock().await;
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
        self.remove_env(&key);
        std::fs::create_dir_all(&self.root)?;
        set_mode(&self.root, 0o711)?;
        std::fs::create_dir(&lease.dir)?;
        let dir = Folder::open(&lease.dir)?;
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
        if let Some(e) = failed {
            self.remove_env(&key);
            return Err(e);
        }
        // Nothing of the build runs any more (its sandbox or container ended with it): the
        // folder becomes the agent's, so no later task, whatever its uid, can change it.
        if launch.user.is_some() {
            let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
            dir.chown_all(uid.as_raw(), gid.as_raw())?;
        }
        std::fs::write(&ready, format!("{:.1}\n", t.elapsed().as_secs_f64()))?;
        let said = format!(
            "environment {} built in {:.1} s",
            &key[..12],
            t.elapsed().as_secs_f64()
        );
        let _ = steps.send(said.clone());
        log.push(Stream::Stdout, format!("[autodl-agent] {said}"));
        self.remove_unused(&key);
        let mut lease = lease;
        lease.reused = false;
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

    /// Environments no attempt uses, unused for [`UNUSED_FOR`], and what failed builds left.
    fn remove_unused(&self, keep: &str) {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        let now = SystemTime::now();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let key = name.strip_suffix(".ready").unwrap_or(&name).to_owned();
            if key == keep || key.len() != 32 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
                continue;
            }
            let ready = self.root.join(format!("{key}.ready"));
            let last_used = std::fs::metadata(&ready).and_then(|m| m.modified());
            let stale = match last_used {
                Ok(t) => now.duration_since(t).unwrap_or_default() > UNUSED_FOR,
                Err(_) => true,
            };
            let busy = lock(&self.keys)
                .get(&key)
                .is_some_and(|k| k.users > 0 || Arc::strong_count(&k.build) > 1);
            if stale && !busy {
                self.remove_env(&key);
            }
        }
    }
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
    fn local_files_are_what_pip_reads_from_the_code() {
        assert_eq!(
            local_files(
                "# c\nnumpy>=2\n-r dev.txt\n./wheels/x.whl # pinned\n-e .\n../up.txt\n/abs.whl\n"
            ),
            vec!["numpy>=2", "dev.txt", "wheels/x.whl"]
        );
    }
}
