//! The upload protocol of checkpoints and results. Agents upload through the server (they hold
//! node credentials, never storage keys): an upload is started, its files are streamed one by
//! one into the organization's area, and a commit checks every file against the bucket's
//! listing before the artifact becomes visible. The newest `keep` checkpoints of a task are
//! kept; uploads that are replaced, abandoned or never committed are deleted.

use std::collections::{BTreeMap, HashSet};

use autodl_common::agent::{ArtifactFile, ArtifactStart};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use serde::Serialize;

use crate::domain::{ArtifactKind, ArtifactState};
use crate::error::ApiError;
use crate::state::AppState;
use crate::storage::{clean_path, delete_prefix, put_bytes, usage, Storage, StorageError};
use crate::store::{ArtifactRecord, Artifacts};
use crate::tasks::checkpoints::discard_upload;
use crate::tasks::lifecycle::RESULTS_UPLOADING;
use crate::tasks::results;
use crate::usecases::runs::run_or_ended_run;

/// In the bucket too, an artifact with a manifest is a complete one.
pub(crate) const MANIFEST: &str = ".autodl-manifest.json";
const MAX_FILES: usize = 100_000;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Committed {
    pub id: String,
    pub files: u64,
    pub size_bytes: u64,
}

/// An upload begins: where its files go (the task's `save_to`, or the organization's area)
/// and its id. Refused when the organization's storage is full.
pub async fn start(
    state: &AppState,
    node: &str,
    task_id: &str,
    body: &ArtifactStart,
) -> Result<String, ApiError> {
    let t = run_or_ended_run(state, node, task_id, body.attempt).await?;
    let kind = ArtifactKind::parse(&body.kind)?;
    if body.epoch.is_some_and(|e| !e.is_finite()) {
        return Err(ApiError::invalid("epoch", "epoch must be a finite number"));
    }
    let spec = &t.task.spec;
    let task = &t.task;
    if usage::room(state.store.as_ref(), &task.tenant_id).await? == Some(0) {
        let what = format!("{} not saved", kind.as_str());
        let e = usage::over_quota(0, None);
        let _ = state
            .store
            .add_event(
                &task.id,
                "storage_quota",
                &format!("{what}: {e}"),
                state.clock.now_ms(),
            )
            .await;
        return Err(e);
    }
    // Keys stay short (`<tenant>/checkpoints/<id>/...`): some S3 implementations keep
    // per-object files named after the whole key. The store links each artifact to its task.
    let artifact_id = uuid::Uuid::new_v4().simple().to_string();
    let (bucket, prefix) = match spec.checkpoint.as_ref().and_then(|c| c.save_to.as_deref()) {
        Some(url) if kind == ArtifactKind::Checkpoint && url.starts_with("s3://") => {
            let (b, p) = state
                .storage
                .resolve(&task.tenant_id, url)
                .map_err(|m| ApiError::invalid("checkpoint.save_to", m))?;
            (b, format!("{p}{artifact_id}/"))
        }
        _ => (
            state.storage.default_bucket.clone(),
            format!(
                "{}{}/{artifact_id}/",
                state.storage.tenant_prefix(&task.tenant_id),
                kind.folder(),
            ),
        ),
    };
    let rec = ArtifactRecord {
        prefix,
        id: artifact_id.clone(),
        task_id: task.id.clone(),
        tenant_id: task.tenant_id.clone(),
        attempt: i64::from(body.attempt),
        kind,
        state: ArtifactState::Uploading,
        bucket,
        manifest: None,
        files: 0,
        size_bytes: 0,
        step: body.step,
        epoch: body.epoch,
        created_at: state.clock.now_ms(),
        completed_at: None,
        node: Some(node.to_owned()),
    };
    // An upload of the same kind that an earlier try of this node left open (its agent gave
    // up or died) is replaced by this one: its files go now, not at the daily sweep. Another
    // node's (the results of its own workers of a gang) are its own.
    let superseded: Vec<ArtifactRecord> = state
        .store
        .open_uploads(&task.id, kind)
        .await?
        .into_iter()
        .filter(|a| a.node.as_deref().is_none_or(|n| n == node))
        .collect();
    state.store.create_artifact(&rec).await?;
    if !superseded.is_empty() {
        let (store, storage) = (state.store.clone(), state.storage.clone());
        tokio::spawn(async move {
            for old in superseded {
                discard_upload(store.as_ref(), &storage, &old).await;
            }
        });
    }
    Ok(artifact_id)
}

/// The agent gives up on an upload (storage full, the file changed, shutting down): its files
/// are deleted now. Repeating it is harmless; a committed upload cannot be abandoned.
pub async fn abandon(state: &AppState, node: &str, id: &str) -> Result<(), ApiError> {
    let a = artifact(state, id).await?;
    match a.state {
        ArtifactState::Uploading => {
            check_open(state, node, &a).await?;
            discard_upload(state.store.as_ref(), &state.storage, &a).await;
            Ok(())
        }
        ArtifactState::Deleting | ArtifactState::Deleted => Ok(()),
        ArtifactState::Complete => Err(ApiError::Conflict(format!("upload {} is complete", a.id))),
    }
}

/// One file of an open upload, streamed into object storage. Agents' files have no size cap
/// of their own: their bytes count against the organization's storage quota as they arrive,
/// and a file that would pass it is refused (the upload then fails and is given up).
pub async fn put_file<E: std::fmt::Display>(
    state: &AppState,
    node: &str,
    id: &str,
    rel: &str,
    body: &mut (impl Stream<Item = Result<Bytes, E>> + Unpin),
) -> Result<(), ApiError> {
    let a = uploading(state, node, id).await?;
    let rel = parse_rel(rel).map_err(not_writable)?;
    let key = format!("{}{rel}", a.prefix);
    check_key(&key).map_err(not_writable)?;
    let what = format!("saving {}", a.kind);
    let up = match state.storage.backend.start_upload(&a.bucket, &key).await {
        Ok(u) => u,
        Err(e) => return Err(storage_failed(state, &a.task_id, &what, e).await),
    };
    let mut quota = usage::Reservation::new(state.store.as_ref(), &a.tenant_id, 0).await?;
    let received = receive(
        up,
        body,
        u64::MAX,
        || ApiError::PayloadTooLarge("file too large".into()),
        &mut quota,
    )
    .await;
    let kept = *received.as_ref().unwrap_or(&0);
    quota.finish(kept).await?;
    if kept > 0 {
        // Counted now; the commit settles it against what the bucket holds.
        state.store.add_upload_bytes(&a.id, kept as i64).await?;
    }
    match received {
        Ok(_) => Ok(()),
        Err(ReceiveError::Request(e)) => Err(e),
        Err(ReceiveError::Storage(e)) => Err(storage_failed(state, &a.task_id, &what, e).await),
    }
}

/// Every file is uploaded: checked against the bucket's listing, then the upload becomes a
/// complete artifact (a checkpoint to restore from, or the task's results) and older ones
/// beyond what is kept are retired. A commit repeated after a lost answer gets the same answer.
pub async fn commit(
    state: &AppState,
    node: &str,
    id: &str,
    files: Vec<ArtifactFile>,
) -> Result<Committed, ApiError> {
    let a = artifact(state, id).await?;
    // A commit repeated after a lost answer gets the same answer.
    if a.state == ArtifactState::Complete
        && a.manifest.as_deref() == serde_json::to_string(&files).ok().as_deref()
    {
        // What the first answer's loss may have left undone.
        settle_late_results(state, node, &a).await?;
        return Ok(Committed {
            id: a.id,
            files: a.files.max(0) as u64,
            size_bytes: a.size_bytes.max(0) as u64,
        });
    }
    check_open(state, node, &a).await?;
    if files.is_empty() || files.len() > MAX_FILES {
        return Err(ApiError::invalid(
            "files",
            format!("an upload has 1 to {MAX_FILES} files"),
        ));
    }
    let mut seen = HashSet::new();
    for f in &files {
        let p = parse_rel(&f.path)?;
        if p != f.path || !seen.insert(p) {
            return Err(ApiError::invalid(
                "files",
                format!("file path {:?} is not canonical or is listed twice", f.path),
            ));
        }
    }
    let what = format!("saving {}", a.kind);
    let listed = match state.storage.backend.list(&a.bucket, &a.prefix).await {
        Ok(l) => l,
        Err(e) => return Err(storage_failed(state, &a.task_id, &what, e).await),
    };
    let sizes: BTreeMap<&str, u64> = listed.iter().map(|o| (o.key.as_str(), o.size)).collect();
    for f in &files {
        match sizes.get(f.path.as_str()) {
            Some(&n) if n == f.size => {}
            Some(&n) => {
                return Err(ApiError::invalid(
                    "files",
                    format!("{} has {n} bytes in storage, not {}", f.path, f.size),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    "files",
                    format!("{} was not uploaded", f.path),
                ))
            }
        }
    }
    let manifest = serde_json::to_string(&files).map_err(anyhow::Error::from)?;
    // Written last: in the bucket too, a checkpoint with a manifest is a complete one.
    if let Err(e) = put_bytes(
        state.storage.backend.as_ref(),
        &a.bucket,
        &format!("{}{MANIFEST}", a.prefix),
        Bytes::from(manifest.clone()),
    )
    .await
    {
        return Err(storage_failed(state, &a.task_id, &what, e).await);
    }
    let size: u64 = files.iter().map(|f| f.size).sum();
    let mut rec = a.clone();
    rec.manifest = Some(manifest);
    rec.files = files.len() as i64;
    rec.size_bytes = size as i64;
    if !state
        .store
        .complete_artifact(&rec, state.clock.now_ms())
        .await?
    {
        return Err(ApiError::Conflict(format!(
            "upload {} is no longer open",
            a.id
        )));
    }
    // Its bytes were counted as they arrived (`a`, read before every file was in; a file
    // sent twice counted twice): settled against what the bucket holds.
    state
        .store
        .add_storage_bytes(&a.tenant_id, size as i64 - a.size_bytes)
        .await?;
    let keep = if a.kind == ArtifactKind::Checkpoint {
        let task = state.store.task(None, &a.task_id).await?;
        Keep::Newest(
            task.and_then(|t| t.task.spec.checkpoint.as_ref().and_then(|c| c.keep))
                .unwrap_or(state.settings.checkpoint_keep)
                .max(1) as usize,
        )
    } else {
        Keep::CurrentResults
    };
    // Deleting old checkpoints can take a while on S3: after answering.
    let (store, storage, task_id, kind) = (
        state.store.clone(),
        state.storage.clone(),
        a.task_id.clone(),
        a.kind,
    );
    tokio::spawn(async move { retire(store.as_ref(), &storage, &task_id, kind, keep).await });
    rec.state = ArtifactState::Complete;
    settle_late_results(state, node, &rec).await?;
    Ok(Committed {
        id: a.id,
        files: files.len() as u64,
        size_bytes: size,
    })
}

/// Results uploaded after their run ended (its node kept them meanwhile): the task has them
/// once no node of its attempt keeps any still ([`settle_when_every_part_is_in`]). Repeated
/// with a repeated commit, so that an answer lost after the commit cannot leave the task
/// uploading for ever.
async fn settle_late_results(
    state: &AppState,
    node: &str,
    a: &ArtifactRecord,
) -> Result<(), ApiError> {
    if a.kind != ArtifactKind::Results {
        return Ok(());
    }
    // A gang's node: its part keeps nothing now.
    state
        .store
        .part_results_settled(&a.task_id, a.attempt, node)
        .await?;
    settle_when_every_part_is_in(
        state,
        &a.task_id,
        a.attempt,
        &format!(
            "results saved from node {node} after the run ended ({} files, {} bytes)",
            a.files, a.size_bytes
        ),
    )
    .await
}

/// A completed task whose results were uploading has them once no node of the attempt keeps
/// any still: its timeline says `message`. Both a late upload and the attempt's end call it,
/// after each wrote what it knows, so whichever comes second settles them.
pub(crate) async fn settle_when_every_part_is_in(
    state: &AppState,
    task_id: &str,
    attempt: i64,
    message: &str,
) -> Result<(), ApiError> {
    let uploading = state
        .store
        .task(None, task_id)
        .await?
        .is_some_and(|t| t.task.results.as_deref() == Some(RESULTS_UPLOADING));
    if !uploading {
        return Ok(());
    }
    let parts = state.store.ended_parts(task_id, attempt).await?;
    if parts.iter().any(|p| p.results_uploading) {
        return Ok(());
    }
    state
        .store
        .settle_results(task_id, attempt, None, message, state.clock.now_ms())
        .await?;
    Ok(())
}

/// Which complete artifacts of a kind a task keeps.
#[derive(Debug, Clone, Copy)]
enum Keep {
    /// The newest n (checkpoints).
    Newest(usize),
    /// Its results now: the newest attempt's, one per node ([`results::current`]).
    CurrentResults,
}

/// Deletes the complete artifacts of a kind a task no longer keeps. A failed deletion leaves
/// the row `deleting` (never restored from); the server's hourly sweep tries it again.
async fn retire(
    store: &dyn Artifacts,
    storage: &Storage,
    task_id: &str,
    kind: ArtifactKind,
    keep: Keep,
) {
    let mut all = match store.task_artifacts(task_id, kind).await {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, task_id, "could not list artifacts for retention");
            return;
        }
    };
    let old = match keep {
        Keep::Newest(n) => all.split_off(n.min(all.len())),
        Keep::CurrentResults => results::current(all).1,
    };
    for old in old {
        if !store
            .set_artifact_state(&old.id, ArtifactState::Complete, ArtifactState::Deleting)
            .await
            .unwrap_or(false)
        {
            continue;
        }
        // No longer the organization's once it leaves `complete`, deleted yet or not.
        let _ = store
            .add_storage_bytes(&old.tenant_id, -old.size_bytes)
            .await;
        match delete_prefix(storage.backend.as_ref(), &old.bucket, &old.prefix).await {
            Ok(_) => {
                let _ = store
                    .set_artifact_state(&old.id, ArtifactState::Deleting, ArtifactState::Deleted)
                    .await;
            }
            Err(e) => {
                tracing::warn!(error = %e, artifact = old.id, "could not delete an old artifact")
            }
        }
    }
}

/// An artifact still being uploaded by the node that runs its attempt.
async fn uploading(state: &AppState, node: &str, id: &str) -> Result<ArtifactRecord, ApiError> {
    let a = artifact(state, id).await?;
    check_open(state, node, &a).await?;
    Ok(a)
}

async fn artifact(state: &AppState, id: &str) -> Result<ArtifactRecord, ApiError> {
    state
        .store
        .artifact(id)
        .await?
        .ok_or_else(|| ApiError::NotFound("no such upload".into()))
}

async fn check_open(state: &AppState, node: &str, a: &ArtifactRecord) -> Result<(), ApiError> {
    // Each node of a gang uploads its own; another node's upload is not its to touch.
    if a.node.as_deref().is_some_and(|n| n != node) {
        return Err(ApiError::Conflict(format!(
            "upload {} is another node's",
            a.id
        )));
    }
    if a.state != ArtifactState::Uploading {
        return Err(ApiError::Conflict(format!(
            "upload {} is {}",
            a.id, a.state
        )));
    }
    run_or_ended_run(state, node, &a.task_id, a.attempt as u32).await?;
    Ok(())
}

/// Records an object storage failure on the task, so its owner sees why a save is late.
pub(crate) async fn storage_failed(
    state: &AppState,
    task_id: &str,
    what: &str,
    e: StorageError,
) -> ApiError {
    if matches!(e, StorageError::Unavailable(_)) {
        let _ = state
            .store
            .add_event(
                task_id,
                "storage_error",
                &format!("{what}: object storage is unavailable ({e}); the agent retries"),
                state.clock.now_ms(),
            )
            .await;
    }
    e.into()
}

/// Object keys are at most 1024 bytes on S3, prefixes included.
pub(crate) fn check_key(key: &str) -> Result<(), ApiError> {
    if key.len() > 1024 {
        return Err(ApiError::invalid(
            "path",
            "the path is too long for object storage (1024 bytes with its prefix)",
        ));
    }
    Ok(())
}

/// Why streaming a body into storage stopped: the request's fault, or the store's (which
/// agent uploads record on the task).
pub(crate) enum ReceiveError {
    Request(ApiError),
    Storage(StorageError),
}

/// Streams a request body into an object, refusing more than `max` bytes (with `too_big`'s
/// error); aborts the upload on any error.
/// Streams a request body into storage, at most `max` bytes, each chunk counted against the
/// organization's storage quota (`quota`) before it is written.
pub(crate) async fn receive<E: std::fmt::Display>(
    mut up: Box<dyn crate::storage::Upload>,
    payload: &mut (impl Stream<Item = Result<Bytes, E>> + Unpin),
    max: u64,
    too_big: impl Fn() -> ApiError,
    quota: &mut usage::Reservation<'_, dyn crate::store::Store>,
) -> Result<u64, ReceiveError> {
    let mut n = 0u64;
    while let Some(chunk) = payload.next().await {
        let failed = match chunk {
            Err(e) => {
                ReceiveError::Request(ApiError::BadRequest(format!("upload interrupted: {e}")))
            }
            Ok(chunk) => {
                n += chunk.len() as u64;
                if n > max {
                    ReceiveError::Request(too_big())
                } else if let Err(e) = quota.take(chunk.len() as u64).await {
                    ReceiveError::Request(e)
                } else {
                    match up.write(chunk).await {
                        Ok(()) => continue,
                        Err(e) => ReceiveError::Storage(e),
                    }
                }
            }
        };
        up.abort().await;
        return Err(failed);
    }
    up.finish().await.map_err(ReceiveError::Storage)
}

pub(crate) fn parse_rel(path: &str) -> Result<String, ApiError> {
    let p = clean_path(path).map_err(|m| ApiError::invalid("path", m))?;
    if p.is_empty() {
        return Err(ApiError::invalid("path", "a file path is required"));
    }
    if p.split('/').any(|s| s.starts_with(".autodl-")) {
        return Err(ApiError::invalid(
            "path",
            "names starting with .autodl- are reserved",
        ));
    }
    Ok(p)
}

/// A path no file may have, to be written: refused.
pub(crate) fn not_writable(e: ApiError) -> ApiError {
    match e {
        ApiError::Validation { message, .. } => ApiError::Refused {
            field: "path",
            message,
        },
        other => other,
    }
}
