//! Moving folders between the node and the platform's object storage, through the server (the
//! agent holds no storage credentials): checkpoint and results uploads, checkpoint restores,
//! and `s3://` datasets fetched into a cache.
//!
//! An upload first snapshots the folder (hard links, so the task may keep writing new files),
//! then sends each file and commits; the server makes a checkpoint visible only at the commit.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::beneath::Folder;
use crate::client::{encode_path, encode_segment, ServerClient};
use crate::error::ClientError;
use crate::protocol::{ArtifactCommit, ArtifactFile, ArtifactStart, DataManifest, RestoreRef};

/// Written by the task (the SDK's `autodl.checkpoint.save()`) to ask for an upload now; it may
/// hold `{"step": 12, "epoch": 3}`. Files named `.autodl-*` are never uploaded.
pub const SAVE_MARKER: &str = ".autodl-save";
const PRIVATE_PREFIX: &str = ".autodl-";

/// How many times one transfer is tried before the agent gives up on it for now.
pub const TRANSFER_TRIES: u32 = 6;

#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The attempt is no longer current (the server answered 409).
    #[error("the attempt is no longer current")]
    Stale,
    #[error("stopped while transferring")]
    Cancelled,
}

/// What one upload sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Uploaded {
    pub id: String,
    pub files: usize,
    pub bytes: u64,
    pub took: Duration,
}

/// `(path, size, mtime)` of every file: equal fingerprints mean nothing changed since.
pub type Fingerprint = Vec<(String, u64, u128)>;

/// Whether the agent may send a file under this name: not one of its own `.autodl-*` files,
/// and a name object storage can hold.
fn sendable(rel: &str) -> bool {
    if rel
        .split('/')
        .any(|seg| seg.starts_with(PRIVATE_PREFIX) || seg.ends_with(".autodl-part"))
    {
        return false;
    }
    if rel.len() > 1024
        || rel
            .split('/')
            .any(|seg| seg.len() > 255 || seg.chars().any(|c| c.is_control() || c == '\\'))
    {
        tracing::warn!(
            path = rel,
            "skipping a file whose name object storage cannot hold"
        );
        return false;
    }
    true
}

/// Files below `dir` (relative `/` paths), without the agent's own `.autodl-*` files. With
/// `owner`, only files of that uid count: a task can place nothing else there but hard links
/// to files of others, which are not its to save.
///
/// The folder is walked beneath a handle ([`crate::beneath`]): the task may change it
/// meanwhile, and no link it plants is followed.
pub fn scan(dir: &Path, owner: Option<u32>) -> std::io::Result<Fingerprint> {
    let folder = match Folder::open(dir) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut skipped = |p: &str| {
        tracing::warn!(
            path = p,
            "skipping a file whose name is not UTF-8 or that is nested too deep"
        )
    };
    let mut out: Fingerprint = folder
        .files(&mut skipped)?
        .into_iter()
        .filter(|f| sendable(&f.path) && owner.is_none_or(|o| o == f.uid))
        .map(|f| (f.path, f.size, f.mtime_ns))
        .collect();
    out.sort();
    Ok(out)
}

/// Hard-links (or copies, across file systems) the listed files into `staging`; returns the
/// ones still there, as they are now. Each file is opened beneath `src` with no link
/// followed, checked by its handle (a regular file of `owner`), and linked from that handle:
/// whatever the task renames or swaps meanwhile, only its own files are taken. A hard link
/// shares the file, so an upload checks afterwards that the task did not rewrite it in place
/// meanwhile (`unchanged`).
fn snapshot(
    src: &Path,
    staging: &Path,
    files: &Fingerprint,
    owner: Option<u32>,
) -> std::io::Result<Fingerprint> {
    let src = Folder::open(src)?;
    let staging = Folder::open(staging)?;
    let mut kept = Vec::with_capacity(files.len());
    for f in files {
        let (file, meta) = match src.open_file(&f.0) {
            Ok(opened) => opened,
            // Rotated away (or swapped for a link) by the task between the scan and now:
            // not part of this checkpoint.
            Err(e) => {
                tracing::debug!(path = f.0, error = %e, "left out of the snapshot");
                continue;
            }
        };
        if owner.is_some_and(|o| o != meta.uid()) {
            continue;
        }
        let (parent, name) = match f.0.rsplit_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, f.0.as_str()),
        };
        let at = match parent {
            Some(p) => staging.create_dir_all(p, 0o700)?,
            None => staging.try_clone()?,
        };
        if let Err(e) = at.link_or_copy(&file, name) {
            tracing::warn!(path = f.0, error = %e, "left out of the snapshot");
            continue;
        }
        kept.push((f.0.clone(), meta.len(), crate::beneath::mtime_ns(&meta)));
    }
    Ok(kept)
}

/// Takes the files of `src` (those of `owner`, as [`scan`] lists them) into `dest`, a new
/// folder of the agent's own: hard links where they share a file system, else copies, each
/// opened beneath `src` with no link followed. Returns how many files it took; fails unless
/// it took them all (the task has ended, so none may go missing: one that could not be taken
/// would be lost from what is kept as whole).
pub fn keep_folder(src: &Path, dest: &Path, owner: Option<u32>) -> std::io::Result<usize> {
    let files = scan(src, owner)?;
    std::fs::create_dir_all(dest)?;
    if files.is_empty() {
        return Ok(0);
    }
    let taken = snapshot(src, dest, &files, owner)?.len();
    if taken < files.len() {
        return Err(std::io::Error::other(format!(
            "could keep only {taken} of {} files",
            files.len()
        )));
    }
    Ok(taken)
}

/// Reads the step and epoch a task left in its save marker, and removes the marker.
pub fn take_marker(dir: &Path) -> Option<(Option<i64>, Option<f64>)> {
    let folder = Folder::open(dir).ok()?;
    let text = folder.read_small(SAVE_MARKER, 64 * 1024);
    // Removed whatever it is (a link is removed itself), so it is not seen again.
    let _ = folder.remove(SAVE_MARKER);
    let text = text.ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap_or_default();
    Some((
        v.get("step").and_then(serde_json::Value::as_i64),
        v.get("epoch").and_then(serde_json::Value::as_f64),
    ))
}

/// Runs `call` until it succeeds, retrying transient failures with backoff up to
/// [`TRANSFER_TRIES`] times.
async fn retry<T, F, Fut>(
    what: &str,
    backoff: &mut Backoff,
    cancel: &CancellationToken,
    mut call: F,
) -> Result<T, TransferError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let mut tries = 0;
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_conflict() => return Err(TransferError::Stale),
            Err(e) if e.is_transient() && tries + 1 < TRANSFER_TRIES => {
                tries += 1;
                let delay = backoff.next_delay();
                tracing::info!(what, error = %e, ?delay, "transfer failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = cancel.cancelled() => return Err(TransferError::Cancelled),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

pub struct UploadRequest<'a> {
    pub task_id: &'a str,
    pub attempt: u32,
    /// "checkpoint" or "results".
    pub kind: &'a str,
    pub dir: &'a Path,
    /// Where the snapshot is made (same file system as `dir`, so hard links work).
    pub staging: &'a Path,
    pub step: Option<i64>,
    pub epoch: Option<f64>,
    /// The task's uid on an isolated node: only its files are sent.
    pub owner: Option<u32>,
}

/// Uploads the folder as one artifact; `Ok(None)` when it holds no files.
pub async fn upload_folder(
    client: &ServerClient,
    req: UploadRequest<'_>,
    backoff: &mut Backoff,
    cancel: &CancellationToken,
) -> Result<Option<Uploaded>, TransferError> {
    let started = Instant::now();
    let (dir, owner) = (req.dir.to_path_buf(), req.owner);
    let files = blocking(move || scan(&dir, owner)).await?;
    if files.is_empty() {
        return Ok(None);
    }
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let staging = req.staging.join(format!(
        "{}-{}-{}",
        req.kind,
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)?;
    let mut opened: Option<String> = None;
    let result = async {
        let (src, dst, listed) = (req.dir.to_path_buf(), staging.clone(), files.clone());
        let files = blocking(move || snapshot(&src, &dst, &listed, owner)).await?;
        if files.is_empty() {
            // Everything listed went away (or was not the task's) before it could be taken.
            return Ok(None);
        }
        let start = ArtifactStart {
            attempt: req.attempt,
            kind: req.kind.to_string(),
            step: req.step,
            epoch: req.epoch,
        };
        let created = retry("start upload", backoff, cancel, || {
            client.start_artifact(req.task_id, &start)
        })
        .await?;
        opened = Some(created.id.clone());
        let mut sent = Vec::with_capacity(files.len());
        let mut bytes = 0;
        for (rel, size, mtime) in &files {
            let local = staging.join(rel);
            retry("upload file", backoff, cancel, || {
                client.put_artifact_file(&created.id, rel, &local)
            })
            .await?;
            if !unchanged(&local, *size, *mtime) {
                return Err(TransferError::Io(std::io::Error::other(format!(
                    "{rel} changed while it was uploaded (write checkpoints to a new file and rename it, e.g. autodl.checkpoint.write_atomic); it is saved at the next try"
                ))));
            }
            let size = *size;
            bytes += size;
            sent.push(ArtifactFile {
                path: rel.clone(),
                size,
            });
        }
        let commit = ArtifactCommit { files: sent };
        retry("commit upload", backoff, cancel, || {
            client.commit_artifact(&created.id, &commit)
        })
        .await?;
        Ok(Some(Uploaded {
            id: created.id,
            files: files.len(),
            bytes,
            took: started.elapsed(),
        }))
    }
    .await;
    let _ = std::fs::remove_dir_all(&staging);
    if let (Err(e), Some(id)) = (&result, &opened) {
        // What reached storage of a failed save is of no use: have it deleted now rather than
        // hold space (a full store is a common reason) until the server's sweep.
        match client.abandon_artifact(id).await {
            Ok(()) => {
                tracing::info!(artifact = id, error = %e, "gave up an upload; its files are deleted")
            }
            Err(a) => {
                tracing::debug!(artifact = id, error = %a, "could not abandon an upload; the server sweeps it")
            }
        }
    }
    result
}

/// Same size and modification time as when the folder was snapshot (`path` is in the
/// agent's own staging folder, which no task can reach).
fn unchanged(path: &Path, size: u64, mtime: u128) -> bool {
    std::fs::symlink_metadata(path)
        .is_ok_and(|m| m.is_file() && m.len() == size && crate::beneath::mtime_ns(&m) == mtime)
}

/// Runs file-system work off the async workers, so polls and heartbeats keep going.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(std::io::Error::other)?
}

fn safe_rel(path: &str) -> Option<&str> {
    let ok = !path.is_empty()
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != ".." && !s.contains('\\'));
    ok.then_some(path)
}

/// Replaces the contents of `dir` with the checkpoint. Returns the bytes downloaded.
pub async fn restore(
    client: &ServerClient,
    r: &RestoreRef,
    dir: &Path,
    backoff: &mut Backoff,
    cancel: &CancellationToken,
) -> Result<u64, TransferError> {
    // Downloaded into a folder of its own beside `dir`, removed if anything fails, and
    // swapped in only complete.
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let staging = tempfile::Builder::new()
        .prefix(".autodl-restoring.")
        .permissions(std::fs::Permissions::from_mode(0o755))
        .tempdir_in(parent)?;
    let tmp = staging.path();
    let mut bytes = 0;
    for f in &r.files {
        let Some(rel) = safe_rel(&f.path) else {
            tracing::warn!(
                path = f.path,
                "skipping a checkpoint file with an unsafe path"
            );
            continue;
        };
        let path = format!(
            "artifacts/{}/files/{}",
            encode_segment(&r.checkpoint_id),
            encode_path(rel)
        );
        let dest = tmp.join(rel);
        bytes += retry("restore file", backoff, cancel, || {
            client.download(&path, &dest)
        })
        .await?;
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(staging.keep(), dir)?;
    Ok(bytes)
}

fn cache_key(source: &str) -> String {
    // FNV-1a: stable across builds, unlike the std hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in source.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Makes the task's `s3://` dataset available under `cache_root`, downloading only when the
/// cached copy differs from the listing (paths, sizes and ETags). Returns the local folder and
/// whether it was already cached.
pub async fn fetch_data(
    client: &ServerClient,
    task_id: &str,
    cache_root: &Path,
    backoff: &mut Backoff,
    cancel: &CancellationToken,
) -> Result<(PathBuf, bool), TransferError> {
    let manifest: DataManifest = retry("data listing", backoff, cancel, || {
        client.data_manifest(task_id)
    })
    .await?;
    let stamp = serde_json::to_string(&manifest.files).unwrap_or_default();
    // One folder per version of the data: a refresh never changes files under a running task.
    let key = format!("{}-{}", cache_key(&manifest.source), cache_key(&stamp));
    let dir = cache_root.join(&key);
    let stamp_file = dir.join(".autodl-manifest.json");
    if std::fs::read_to_string(&stamp_file).ok().as_deref() == Some(stamp.as_str()) {
        return Ok((dir, true));
    }
    std::fs::create_dir_all(cache_root)?;
    let staging = tempfile::Builder::new()
        .prefix(&format!("{key}.partial."))
        // Readable by the tasks it is mounted into, as any folder the agent makes.
        .permissions(std::fs::Permissions::from_mode(0o755))
        .tempdir_in(cache_root)?;
    let tmp = staging.path();
    for f in &manifest.files {
        let Some(rel) = safe_rel(&f.path) else {
            continue;
        };
        let path = format!(
            "tasks/{}/data/files/{}",
            encode_segment(task_id),
            encode_path(rel)
        );
        let dest = tmp.join(rel);
        retry("data file", backoff, cancel, || {
            client.download(&path, &dest)
        })
        .await?;
    }
    std::fs::write(tmp.join(".autodl-manifest.json"), stamp)?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(staging.keep(), &dir)?;
    Ok((dir, false))
}

/// What unpacking a task's code did.
#[derive(Debug, Clone, PartialEq)]
pub struct CodeUnpacked {
    pub files: u64,
    pub bytes: u64,
    /// The bundle was already in this node's cache.
    pub cached: bool,
}

/// Fetches the task's code bundle (once per node: bundles are named by their digest, which is
/// checked) and unpacks it into `dest`, a folder made fresh for this attempt: the previous
/// attempt's task could have left links in the old one.
pub async fn fetch_code(
    client: &ServerClient,
    task_id: &str,
    id: &str,
    cache_root: &Path,
    dest: &Path,
    backoff: &mut Backoff,
    cancel: &CancellationToken,
) -> Result<CodeUnpacked, TransferError> {
    use autodl_common::bundle;
    let bad = |m: String| TransferError::Io(std::io::Error::other(m));
    let hex = bundle::parse_id(id).ok_or_else(|| bad(format!("{id:?} is not a code bundle id")))?;
    let cached_file = cache_root.join(hex);
    let read_checked = |p: &Path| -> Option<Vec<u8>> {
        let bytes = std::fs::read(p).ok()?;
        (bundle::id_of(&bytes) == id).then_some(bytes)
    };
    let (bytes, cached) = match read_checked(&cached_file) {
        Some(b) => (b, true),
        None => {
            // Tasks sharing a bundle start at once on one node: each downloads to a file of
            // its own and moves it into place whole (a rename), so none reads another's
            // half-written copy or loses its file to another's move.
            let part = cache_root.join(format!("{hex}.{}.part", encode_segment(task_id)));
            let path = format!("tasks/{}/code", encode_segment(task_id));
            retry("code bundle", backoff, cancel, || {
                client.download(&path, &part)
            })
            .await?;
            let Some(b) = read_checked(&part) else {
                let _ = std::fs::remove_file(&part);
                return Err(bad(format!("the code bundle sent is not {id}")));
            };
            std::fs::rename(&part, &cached_file)?;
            (b, false)
        }
    };
    let _ = std::fs::remove_dir_all(dest);
    std::fs::create_dir_all(dest)?;
    let dest = dest.to_path_buf();
    let summary = tokio::task::spawn_blocking(move || {
        bundle::unpack(&bytes, &dest, bundle::Limits::default())
    })
    .await
    .map_err(|e| bad(e.to_string()))?
    .map_err(|e| bad(format!("unpacking the code bundle: {e}")))?;
    Ok(CodeUnpacked {
        files: summary.files,
        bytes: summary.unpacked_bytes,
        cached,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_skips_private_files_and_sees_changes() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/w.pt"), b"1234").unwrap();
        std::fs::write(d.path().join(SAVE_MARKER), b"{}").unwrap();
        let a = scan(d.path(), None).unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].0.as_str(), a[0].1), ("sub/w.pt", 4));
        std::fs::write(d.path().join("sub/w.pt"), b"123456").unwrap();
        assert_ne!(scan(d.path(), None).unwrap(), a);
    }

    /// The race of a task against the agent: between the scan and the snapshot it swaps a
    /// listed folder for a link to a folder of the host, where a file of the same name, size
    /// and time waits. Nothing of the host may be taken.
    #[test]
    fn a_folder_swapped_for_a_link_after_the_scan_leaks_nothing() {
        let d = tempfile::tempdir().unwrap();
        let host = d.path().join("host");
        std::fs::create_dir_all(&host).unwrap();
        std::fs::write(host.join("w.pt"), b"HOST-SECRET").unwrap();
        let ck = d.path().join("ck");
        std::fs::create_dir_all(ck.join("sub")).unwrap();
        std::fs::write(ck.join("sub/w.pt"), b"decoy-bytes").unwrap();
        let when = std::fs::metadata(host.join("w.pt"))
            .unwrap()
            .modified()
            .unwrap();
        std::fs::File::options()
            .write(true)
            .open(ck.join("sub/w.pt"))
            .unwrap()
            .set_modified(when)
            .unwrap();
        let me = Some(nix::unistd::getuid().as_raw());
        let listed = scan(&ck, me).unwrap();
        assert_eq!(listed.len(), 1);
        std::fs::rename(ck.join("sub"), ck.join("moved")).unwrap();
        std::os::unix::fs::symlink(&host, ck.join("sub")).unwrap();
        let staging = d.path().join("staging");
        std::fs::create_dir_all(&staging).unwrap();
        let kept = snapshot(&ck, &staging, &listed, me).unwrap();
        assert!(kept.is_empty(), "{kept:?}");
        for e in walkdir::WalkDir::new(&staging) {
            let e = e.unwrap();
            if e.file_type().is_file() {
                assert_ne!(std::fs::read(e.path()).unwrap(), b"HOST-SECRET");
            }
        }
        // A link planted as the file itself is no better.
        std::fs::remove_file(ck.join("sub")).unwrap();
        std::fs::create_dir_all(ck.join("sub")).unwrap();
        std::os::unix::fs::symlink(host.join("w.pt"), ck.join("sub/w.pt")).unwrap();
        assert!(snapshot(&ck, &staging, &listed, me).unwrap().is_empty());
        let names: Vec<String> = scan(&ck, me).unwrap().into_iter().map(|f| f.0).collect();
        assert_eq!(names, ["moved/w.pt"], "links are not listed");
    }

    #[test]
    fn only_the_task_s_own_files_are_sent() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("w.pt"), b"1").unwrap();
        let me = nix::unistd::getuid().as_raw();
        assert_eq!(scan(d.path(), Some(me)).unwrap().len(), 1);
        assert!(scan(d.path(), Some(me.wrapping_add(1))).unwrap().is_empty());
        let listed = scan(d.path(), None).unwrap();
        let staging = tempfile::tempdir().unwrap();
        let other = Some(me.wrapping_add(1));
        assert!(snapshot(d.path(), staging.path(), &listed, other)
            .unwrap()
            .is_empty());
        assert_eq!(
            snapshot(d.path(), staging.path(), &listed, Some(me))
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn a_marker_that_is_a_link_is_removed_unread() {
        let d = tempfile::tempdir().unwrap();
        let secret = d.path().join("secret.json");
        std::fs::write(&secret, br#"{"step": 99}"#).unwrap();
        let ck = d.path().join("ck");
        std::fs::create_dir_all(&ck).unwrap();
        std::os::unix::fs::symlink(&secret, ck.join(SAVE_MARKER)).unwrap();
        assert_eq!(take_marker(&ck), None);
        assert!(std::fs::symlink_metadata(ck.join(SAVE_MARKER)).is_err());
        assert!(secret.exists());
    }

    #[test]
    fn marker_carries_step_and_is_consumed() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(take_marker(d.path()), None);
        std::fs::write(d.path().join(SAVE_MARKER), br#"{"step": 40, "epoch": 2}"#).unwrap();
        assert_eq!(take_marker(d.path()), Some((Some(40), Some(2.0))));
        assert!(!d.path().join(SAVE_MARKER).exists());
    }

    #[test]
    fn unsafe_paths_are_refused() {
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a\\b"] {
            assert!(safe_rel(bad).is_none(), "{bad}");
        }
        assert_eq!(safe_rel("a/b.pt"), Some("a/b.pt"));
    }

    #[test]
    fn cache_keys_are_stable() {
        assert_eq!(cache_key("b/tenants/t1/x/"), cache_key("b/tenants/t1/x/"));
        assert_ne!(cache_key("b/tenants/t1/x/"), cache_key("b/tenants/t2/x/"));
    }
}
