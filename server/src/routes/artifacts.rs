//! Checkpoints, results and datasets in object storage.
//!
//! Agents upload through the server (they hold node credentials, never storage keys): an upload
//! is started, its files are streamed one by one into the tenant's prefix, and a commit checks
//! every file against the listing before the checkpoint becomes visible. The last N complete
//! checkpoints of a task are kept; the newest is handed to the task's next attempt.
//! Users list checkpoints, download results as a tar archive, and keep datasets under
//! `/objects`, always inside their own tenant's prefix.

use std::collections::{BTreeMap, HashSet};

use actix_web::web::Bytes;
use actix_web::{delete, get, post, put, web, HttpRequest, HttpResponse};
use autodl_common::agent::{
    ArtifactCommit, ArtifactCreated, ArtifactStart, DataFile, DataManifest,
};
use autodl_common::api::ErrorBody;
use autodl_common::tasks::Checkpoint;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::agents::node_caller::NodeCaller;
use crate::auth::Caller;
use crate::domain::{ArtifactKind, ArtifactState};
use crate::error::ApiError;
use crate::json::Json;
use crate::routes::agent::current;
use crate::routes::tasks::find;
use crate::scheduling::housekeeping::discard_upload;
use crate::state::{rfc3339, AppState};
use crate::storage::{clean_path, delete_prefix, put_bytes, usage, ByteStream, StorageError};
use crate::store::{ArtifactRecord, TaskRecord};
use crate::tasks::checkpoints::files_of;
use crate::tasks::{placement_of, spec_of};

const MANIFEST: &str = ".autodl-manifest.json";
const MAX_FILES: usize = 100_000;
/// Room for a manifest of `MAX_FILES` files with long paths.
const COMMIT_BODY_LIMIT: usize = 64 << 20;

/// Records an object storage failure on the task, so its owner sees why a save is late.
async fn storage_failed(state: &AppState, task_id: &str, what: &str, e: StorageError) -> ApiError {
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
fn check_key(key: &str) -> Result<(), ApiError> {
    if key.len() > 1024 {
        return Err(ApiError::invalid(
            "path",
            "the path is too long for object storage (1024 bytes with its prefix)",
        ));
    }
    Ok(())
}

/// Who may change an organization's objects, one rule for storing, replacing and deleting:
/// every member, anywhere but `checkpoints/` and `results/`, which hold what the platform saved
/// for tasks (users read them, only agents write there).
fn may_write_objects(_caller: &Caller, rel: &str) -> Result<(), ApiError> {
    let top = rel.split('/').next().unwrap_or_default();
    if top == "checkpoints" || top == "results" {
        return Err(ApiError::Forbidden(format!(
            "{top}/ holds what the platform saved for tasks; it is read-only"
        )));
    }
    Ok(())
}

/// Why streaming a body into storage stopped: the request's fault, or the store's (which
/// agent uploads record on the task).
enum ReceiveError {
    Request(ApiError),
    Storage(StorageError),
}

/// Streams a request body into an object, refusing more than `max` bytes (with `too_big`'s
/// error); aborts the upload on any error.
async fn receive(
    mut up: Box<dyn crate::storage::Upload>,
    payload: &mut web::Payload,
    max: u64,
    too_big: impl Fn() -> ApiError,
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

/// A path no file can have, asked for: there is no such file.
fn no_such_file(_: ApiError) -> ApiError {
    ApiError::NotFound("no such file".into())
}

/// A path no file may have, to be written: refused.
fn not_writable(e: ApiError) -> ApiError {
    match e {
        ApiError::Validation { message, .. } => ApiError::Refused {
            field: "path",
            message,
        },
        other => other,
    }
}

fn parse_rel(path: &str) -> Result<String, ApiError> {
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

#[utoipa::path(params(("id" = String, Path)), request_body = ArtifactStart, responses((status = 201, body = ArtifactCreated), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[post("/agent/tasks/{id}/artifacts")]
#[tracing::instrument(skip(state, node, body), fields(node = %node.node.id))]
pub async fn start_upload(
    state: web::Data<AppState>,
    node: NodeCaller,
    id: web::Path<String>,
    body: Json<ArtifactStart>,
) -> Result<HttpResponse, ApiError> {
    let t = current(&state, &node, &id, body.attempt).await?;
    let kind = ArtifactKind::parse(&body.kind)?;
    if body.epoch.is_some_and(|e| !e.is_finite()) {
        return Err(ApiError::invalid("epoch", "epoch must be a finite number"));
    }
    let spec = spec_of(&t.task)?;
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
    };
    // An upload of the same kind that an earlier try left open (its agent gave up or died)
    // is replaced by this one: its files go now, not at the daily sweep.
    let superseded = state.store.open_uploads(&task.id, kind).await?;
    state.store.create_artifact(&rec).await?;
    if !superseded.is_empty() {
        let st = state.clone();
        actix_web::rt::spawn(async move {
            for old in superseded {
                discard_upload(st.store.as_ref(), &st.storage, &old).await;
            }
        });
    }
    Ok(HttpResponse::Created().json(ArtifactCreated { id: artifact_id }))
}

/// The agent gives up on an upload (storage full, the file changed, shutting down): its files
/// are deleted now. Repeating it is harmless; a committed upload cannot be abandoned.
#[utoipa::path(params(("id" = String, Path)), responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[post("/agent/artifacts/{id}/abandon")]
#[tracing::instrument(skip(state, node), fields(node = %node.node.id))]
pub async fn abandon(
    state: web::Data<AppState>,
    node: NodeCaller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let a = artifact(&state, &id).await?;
    match a.state {
        ArtifactState::Uploading => {
            current(&state, &node, &a.task_id, a.attempt as u32).await?;
            discard_upload(state.store.as_ref(), &state.storage, &a).await;
            Ok(HttpResponse::NoContent().finish())
        }
        ArtifactState::Deleting | ArtifactState::Deleted => Ok(HttpResponse::NoContent().finish()),
        ArtifactState::Complete => Err(ApiError::Conflict(format!("upload {} is complete", a.id))),
    }
}

/// An artifact still being uploaded by the node that runs its attempt.
async fn uploading(
    state: &AppState,
    node: &NodeCaller,
    id: &str,
) -> Result<ArtifactRecord, ApiError> {
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

async fn check_open(
    state: &AppState,
    node: &NodeCaller,
    a: &ArtifactRecord,
) -> Result<(), ApiError> {
    if a.state != ArtifactState::Uploading {
        return Err(ApiError::Conflict(format!(
            "upload {} is {}",
            a.id, a.state
        )));
    }
    current(state, node, &a.task_id, a.attempt as u32).await?;
    Ok(())
}

#[utoipa::path(params(("id" = String, Path), ("path" = String, Path)), request_body(content = Vec<u8>, content_type = "application/octet-stream"), responses((status = 204), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
#[put("/agent/artifacts/{id}/files/{path:.*}")]
#[tracing::instrument(skip(state, node, payload), fields(node = %node.node.id))]
pub async fn put_file(
    state: web::Data<AppState>,
    node: NodeCaller,
    path: web::Path<(String, String)>,
    mut payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (id, rel) = path.into_inner();
    let a = uploading(&state, &node, &id).await?;
    let rel = parse_rel(&rel).map_err(not_writable)?;
    let key = format!("{}{rel}", a.prefix);
    check_key(&key).map_err(not_writable)?;
    let what = format!("saving {}", a.kind);
    let up = match state.storage.backend.start_upload(&a.bucket, &key).await {
        Ok(u) => u,
        Err(e) => return Err(storage_failed(&state, &a.task_id, &what, e).await),
    };
    match receive(up, &mut payload, u64::MAX, unreachable_limit).await {
        Ok(_) => Ok(HttpResponse::NoContent().finish()),
        Err(ReceiveError::Request(e)) => Err(e),
        Err(ReceiveError::Storage(e)) => Err(storage_failed(&state, &a.task_id, &what, e).await),
    }
}

/// Agents' files have no size cap of their own (the quota is checked when an upload starts).
fn unreachable_limit() -> ApiError {
    ApiError::PayloadTooLarge("file too large".into())
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Committed {
    pub id: String,
    pub files: u64,
    pub size_bytes: u64,
}

#[utoipa::path(params(("id" = String, Path)), request_body = ArtifactCommit, responses((status = 200, body = Committed), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
#[post("/agent/artifacts/{id}/commit")]
#[tracing::instrument(skip(state, node, payload), fields(node = %node.node.id))]
pub async fn commit(
    state: web::Data<AppState>,
    node: NodeCaller,
    id: web::Path<String>,
    mut payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    // A manifest of many files is far over the API's usual JSON limit: read it here.
    let mut raw = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::BadRequest(format!("body interrupted: {e}")))?;
        if raw.len() + chunk.len() > COMMIT_BODY_LIMIT {
            return Err(ApiError::PayloadTooLarge(format!(
                "a commit body is at most {COMMIT_BODY_LIMIT} bytes"
            )));
        }
        raw.extend_from_slice(&chunk);
    }
    let body: ArtifactCommit = serde_json::from_slice(&raw)
        .map_err(|e| ApiError::BadRequest(format!("invalid commit body: {e}")))?;
    let a = artifact(&state, &id).await?;
    let files = body.files;
    // A commit repeated after a lost answer gets the same answer.
    if a.state == ArtifactState::Complete
        && a.manifest.as_deref() == serde_json::to_string(&files).ok().as_deref()
    {
        return Ok(HttpResponse::Ok().json(Committed {
            id: a.id,
            files: a.files.max(0) as u64,
            size_bytes: a.size_bytes.max(0) as u64,
        }));
    }
    check_open(&state, &node, &a).await?;
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
        Err(e) => return Err(storage_failed(&state, &a.task_id, &what, e).await),
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
        return Err(storage_failed(&state, &a.task_id, &what, e).await);
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
    state
        .store
        .add_storage_bytes(&a.tenant_id, size as i64)
        .await?;
    let keep = if a.kind == ArtifactKind::Checkpoint {
        let task = state.store.task(None, &a.task_id).await?;
        task.and_then(|t| spec_of(&t.task).ok())
            .and_then(|s| s.checkpoint.and_then(|c| c.keep))
            .unwrap_or(state.settings.checkpoint_keep)
            .max(1) as usize
    } else {
        1
    };
    // Deleting old checkpoints can take a while on S3: after answering.
    let (st, task_id, kind) = (state.clone(), a.task_id.clone(), a.kind);
    actix_web::rt::spawn(async move { retire(&st, &task_id, kind, keep).await });
    Ok(HttpResponse::Ok().json(Committed {
        id: a.id,
        files: files.len() as u64,
        size_bytes: size,
    }))
}

/// Deletes all but the newest `keep` complete artifacts of a kind. A failed deletion leaves
/// the row `deleting` (never restored from); the server's hourly sweep tries it again.
async fn retire(state: &AppState, task_id: &str, kind: ArtifactKind, keep: usize) {
    let all = match state.store.task_artifacts(task_id, kind).await {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, task_id, "could not list artifacts for retention");
            return;
        }
    };
    for old in all.into_iter().skip(keep) {
        if !state
            .store
            .set_artifact_state(&old.id, ArtifactState::Complete, ArtifactState::Deleting)
            .await
            .unwrap_or(false)
        {
            continue;
        }
        // No longer the organization's once it leaves `complete`, deleted yet or not.
        let _ = state
            .store
            .add_storage_bytes(&old.tenant_id, -old.size_bytes)
            .await;
        match delete_prefix(state.storage.backend.as_ref(), &old.bucket, &old.prefix).await {
            Ok(_) => {
                let _ = state
                    .store
                    .set_artifact_state(&old.id, ArtifactState::Deleting, ArtifactState::Deleted)
                    .await;
            }
            Err(e) => {
                tracing::warn!(error = %e, artifact = old.id, "could not delete an old artifact")
            }
        }
    }
}

/// Streams one object as the response body.
fn stream_object(size: u64, body: ByteStream) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/octet-stream")
        // Already the bytes to send: keep the compression middleware (and its CPU) off them.
        .insert_header((actix_web::http::header::CONTENT_ENCODING, "identity"))
        .no_chunking(size)
        .streaming(body)
}

/// A task placed on this node (any attempt): restores and data are fetched before it starts.
async fn placed_here(
    state: &AppState,
    node: &NodeCaller,
    task_id: &str,
) -> Result<TaskRecord, ApiError> {
    let t = state
        .store
        .task(None, task_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("no such task".into()))?;
    let here = matches!(t.task.state.as_str(), "scheduled" | "running")
        && placement_of(&t.task).is_some_and(|p| p.iter().any(|w| w.node == node.node.id));
    if !here {
        return Err(ApiError::Conflict(format!(
            "task {task_id} is not placed on this node"
        )));
    }
    Ok(t.task)
}

#[utoipa::path(params(("id" = String, Path), ("path" = String, Path)), responses((status = 200, content_type = "application/octet-stream"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[get("/agent/artifacts/{id}/files/{path:.*}")]
#[tracing::instrument(skip(state, node), fields(node = %node.node.id))]
pub async fn get_file(
    state: web::Data<AppState>,
    node: NodeCaller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (id, rel) = path.into_inner();
    let rel = parse_rel(&rel).map_err(no_such_file)?;
    let a = state
        .store
        .artifact(&id)
        .await?
        .filter(|a| a.state == ArtifactState::Complete && a.kind == ArtifactKind::Checkpoint)
        .ok_or_else(|| ApiError::NotFound("no such checkpoint".into()))?;
    placed_here(&state, &node, &a.task_id).await?;
    let (size, body) = state
        .storage
        .backend
        .get(&a.bucket, &format!("{}{rel}", a.prefix))
        .await?;
    Ok(stream_object(size, body))
}

/// Bucket and key prefix of a task's `s3://` data path.
fn data_location(state: &AppState, t: &TaskRecord) -> Result<(String, String), ApiError> {
    let spec = spec_of(t)?;
    let url = spec
        .data_path
        .filter(|p| p.starts_with("s3://"))
        .ok_or_else(|| ApiError::NotFound("the task has no s3:// data path".into()))?;
    state
        .storage
        .resolve(&t.tenant_id, &url)
        .map_err(|m| ApiError::invalid("data_path", m))
}

#[utoipa::path(params(("id" = String, Path)), responses((status = 200, body = DataManifest), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[get("/agent/tasks/{id}/data")]
#[tracing::instrument(skip(state, node), fields(node = %node.node.id))]
pub async fn data_manifest(
    state: web::Data<AppState>,
    node: NodeCaller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let t = placed_here(&state, &node, &id).await?;
    let (bucket, prefix) = data_location(&state, &t)?;
    let files = state
        .storage
        .backend
        .list(&bucket, &prefix)
        .await?
        .into_iter()
        .map(|o| DataFile {
            path: o.key,
            size: o.size,
            etag: o.etag,
        })
        .collect();
    Ok(HttpResponse::Ok().json(DataManifest {
        source: format!("{bucket}/{prefix}"),
        files,
    }))
}

#[utoipa::path(params(("id" = String, Path), ("path" = String, Path)), responses((status = 200, content_type = "application/octet-stream"), (status = 404, body = ErrorBody)))]
#[get("/agent/tasks/{id}/data/files/{path:.*}")]
#[tracing::instrument(skip(state, node), fields(node = %node.node.id))]
pub async fn data_file(
    state: web::Data<AppState>,
    node: NodeCaller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (id, rel) = path.into_inner();
    let rel = clean_path(&rel).map_err(|_| ApiError::NotFound("no such file".into()))?;
    let t = placed_here(&state, &node, &id).await?;
    let (bucket, prefix) = data_location(&state, &t)?;
    let (size, body) = state
        .storage
        .backend
        .get(&bucket, &format!("{prefix}{rel}"))
        .await?;
    Ok(stream_object(size, body))
}

#[utoipa::path(params(("id" = String, Path)), responses((status = 200, body = Vec<Checkpoint>), (status = 404, body = ErrorBody)))]
#[get("/tasks/{id}/checkpoints")]
#[tracing::instrument(skip(state, caller))]
pub async fn checkpoints(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let t = find(&state, &caller, &id).await?;
    // Shown as the tenant names it (`s3://bucket/path`), usable as a `data_path`.
    let tenant_prefix = state.storage.tenant_prefix(caller.tenant_id());
    let list: Vec<Checkpoint> = state
        .store
        .task_artifacts(&t.task.id, ArtifactKind::Checkpoint)
        .await?
        .into_iter()
        .map(|a| Checkpoint {
            attempt: a.attempt as u32,
            step: a.step,
            epoch: a.epoch,
            files: a.files.max(0) as u64,
            size_bytes: a.size_bytes.max(0) as u64,
            created_at: rfc3339(a.completed_at.unwrap_or(a.created_at)),
            location: format!(
                "s3://{}/{}",
                a.bucket,
                a.prefix.strip_prefix(&tenant_prefix).unwrap_or(&a.prefix)
            ),
            id: a.id,
        })
        .collect();
    Ok(HttpResponse::Ok().json(list))
}

/// A ustar/GNU header for one regular file (with a GNU long-name entry before it when the
/// path does not fit the 100 bytes of the classic header).
fn tar_header(path: &str, size: u64, mtime: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    let mut h = tar::Header::new_gnu();
    let name = path.as_bytes();
    if name.len() > 100 {
        let mut l = tar::Header::new_gnu();
        let long = b"././@LongLink";
        l.as_old_mut().name[..long.len()].copy_from_slice(long);
        l.set_mode(0o644);
        l.set_size(name.len() as u64 + 1);
        l.set_entry_type(tar::EntryType::GNULongName);
        l.set_cksum();
        out.extend_from_slice(l.as_bytes());
        out.extend_from_slice(name);
        out.push(0);
        out.resize(out.len() + padding(name.len() as u64 + 1), 0);
        h.as_old_mut().name.copy_from_slice(&name[..100]);
    } else {
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
    }
    h.set_mode(0o644);
    h.set_size(size);
    h.set_mtime(mtime);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out
}

fn padding(size: u64) -> usize {
    ((512 - size % 512) % 512) as usize
}

enum TarState {
    Header(usize),
    Body(usize, ByteStream, u64),
    Done,
}

/// The task's results as a tar archive, streamed from object storage file by file.
#[utoipa::path(params(("id" = String, Path)), responses((status = 200, content_type = "application/x-tar"), (status = 404, body = ErrorBody)))]
#[get("/tasks/{id}/results")]
#[tracing::instrument(skip(state, caller))]
pub async fn results(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let t = find(&state, &caller, &id).await?;
    let Some(a) = state
        .store
        .task_artifacts(&t.task.id, ArtifactKind::Results)
        .await?
        .into_iter()
        .next()
    else {
        return Err(ApiError::NoResults(format!(
            "task {} has no results (files it leaves in AUTODL_RESULTS_DIR are kept when it completes)",
            t.task.id
        )));
    };
    let files = std::sync::Arc::new(files_of(&a));
    let mtime = (a.completed_at.unwrap_or(a.created_at) / 1000).max(0) as u64;
    let length: u64 = files
        .iter()
        .map(|f| tar_header(&f.path, f.size, mtime).len() as u64 + f.size + padding(f.size) as u64)
        .sum::<u64>()
        + 1024;
    let store = state.storage.backend.clone();
    let (bucket, prefix) = (a.bucket.clone(), a.prefix.clone());
    let stream = futures_util::stream::unfold(TarState::Header(0), move |st| {
        let (store, bucket, prefix, files) =
            (store.clone(), bucket.clone(), prefix.clone(), files.clone());
        async move {
            let io = std::io::Error::other;
            match st {
                TarState::Done => None,
                TarState::Header(i) if i >= files.len() => {
                    Some((Ok(Bytes::from(vec![0u8; 1024])), TarState::Done))
                }
                TarState::Header(i) => {
                    let f = &files[i];
                    match store.get(&bucket, &format!("{prefix}{}", f.path)).await {
                        Ok((_, body)) => Some((
                            Ok(Bytes::from(tar_header(&f.path, f.size, mtime))),
                            TarState::Body(i, body, 0),
                        )),
                        Err(e) => Some((Err(io(e.to_string())), TarState::Done)),
                    }
                }
                TarState::Body(i, mut body, seen) => match body.next().await {
                    Some(Ok(chunk)) => {
                        let seen = seen + chunk.len() as u64;
                        if seen > files[i].size {
                            return Some((
                                Err(io("a result file grew".to_owned())),
                                TarState::Done,
                            ));
                        }
                        Some((Ok(chunk), TarState::Body(i, body, seen)))
                    }
                    Some(Err(e)) => Some((Err(e), TarState::Done)),
                    None if seen != files[i].size => Some((
                        Err(io("a result file is shorter than recorded".to_owned())),
                        TarState::Done,
                    )),
                    None => Some((
                        Ok(Bytes::from(vec![0u8; padding(seen)])),
                        TarState::Header(i + 1),
                    )),
                },
            }
        }
    });
    Ok(HttpResponse::Ok()
        .content_type("application/x-tar")
        .insert_header((actix_web::http::header::CONTENT_ENCODING, "identity"))
        .insert_header((
            "Content-Disposition",
            format!("attachment; filename=\"{}-results.tar\"", t.task.id),
        ))
        .no_chunking(length)
        .streaming(stream))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only objects below this path.
    prefix: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ObjectInfo {
    /// Path inside the tenant's area; `s3://<bucket>/<path>` in task specs.
    pub path: String,
    pub size: u64,
    pub etag: String,
}

fn tenant_key(
    state: &AppState,
    caller: &Caller,
    bucket: &str,
    path: &str,
) -> Result<(String, String), ApiError> {
    let (bucket, dir) = state
        .storage
        .resolve(caller.tenant_id(), &format!("s3://{bucket}/{path}"))
        .map_err(|m| ApiError::invalid("path", m))?;
    Ok((bucket, dir.trim_end_matches('/').to_owned()))
}

/// How a user's object request names its object, checked: `(bucket, key, path)`. A bucket
/// the platform does not offer is a bad request; a path no object can have (`..`, control
/// characters, too long) names nothing to read (404) and may not be written (403).
fn user_object(
    state: &AppState,
    caller: &Caller,
    bucket: &str,
    path: &str,
    write: bool,
) -> Result<(String, String, String), ApiError> {
    if !state.storage.allowed_buckets.iter().any(|b| b == bucket) {
        return Err(ApiError::invalid(
            "bucket",
            format!(
                "bucket {bucket:?} is not one this platform lets tenants use ({})",
                state.storage.allowed_buckets.join(", ")
            ),
        ));
    }
    let named = (|| {
        let rel = parse_rel(path)?;
        if write {
            may_write_objects(caller, &rel)?;
        }
        let (bucket, key) = tenant_key(state, caller, bucket, &rel)?;
        check_key(&key)?;
        Ok::<_, ApiError>((bucket, key, rel))
    })();
    named.map_err(|e| match e {
        e if write => not_writable(e),
        ApiError::Validation { .. } => ApiError::NotFound("no such object".into()),
        other => other,
    })
}

#[utoipa::path(params(("bucket" = String, Path), ListQuery), responses((status = 200, body = Vec<ObjectInfo>), (status = 400, body = ErrorBody)))]
#[get("/objects/{bucket}")]
#[tracing::instrument(skip(state, caller))]
pub async fn list_objects(
    state: web::Data<AppState>,
    caller: Caller,
    bucket: web::Path<String>,
    q: web::Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    let prefix = q.prefix.as_deref().unwrap_or("");
    let (bucket, key) = match user_object(&state, &caller, &bucket, prefix, false) {
        Ok((bucket, key, _)) => (bucket, key),
        // The whole area, or a prefix no object can be below (nothing to list).
        Err(ApiError::NotFound(_)) if prefix.trim_matches('/').is_empty() => {
            tenant_key(&state, &caller, &bucket, "")?
        }
        Err(ApiError::NotFound(_)) => return Ok(HttpResponse::Ok().json(Vec::<ObjectInfo>::new())),
        Err(e) => return Err(e),
    };
    let base = state.storage.tenant_prefix(caller.tenant_id());
    // The prefix names a folder: list below it.
    let list_prefix = format!("{key}/");
    let strip = list_prefix.strip_prefix(&base).unwrap_or("").to_owned();
    let out: Vec<ObjectInfo> = state
        .storage
        .backend
        .list(&bucket, &list_prefix)
        .await?
        .into_iter()
        .map(|o| ObjectInfo {
            path: format!("{strip}{}", o.key),
            size: o.size,
            etag: o.etag,
        })
        .collect();
    Ok(HttpResponse::Ok().json(out))
}

#[utoipa::path(params(("bucket" = String, Path), ("path" = String, Path)), request_body(content = Vec<u8>, content_type = "application/octet-stream"), responses((status = 201, body = ObjectInfo), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 503, body = ErrorBody)))]
#[put("/objects/{bucket}/{path:.*}")]
#[tracing::instrument(skip(state, caller, payload))]
pub async fn put_object(
    state: web::Data<AppState>,
    caller: Caller,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    mut payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (bucket, path) = path.into_inner();
    let (bucket, key, rel) = user_object(&state, &caller, &bucket, &path, true)?;
    let backend = state.storage.backend.as_ref();
    // Replacing an object frees what it held.
    let old = backend.size(&bucket, &key).await?.unwrap_or(0);
    let room = usage::room(state.store.as_ref(), caller.tenant_id())
        .await?
        .map(|r| r.saturating_add(old));
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let (Some(room), Some(n)) = (room, declared) {
        if n > room {
            return Err(usage::over_quota(room, Some(n)));
        }
    }
    let max_object = state.settings.storage_max_object_bytes;
    let max = room.map_or(max_object, |r| r.min(max_object));
    let up = backend.start_upload(&bucket, &key).await?;
    let size = receive(up, &mut payload, max, || match room {
        Some(r) if r < max_object => usage::over_quota(r, None),
        _ => ApiError::PayloadTooLarge(format!("objects are at most {max_object} bytes")),
    })
    .await
    .map_err(|e| match e {
        ReceiveError::Request(e) => e,
        ReceiveError::Storage(e) => e.into(),
    })?;
    state
        .store
        .add_storage_bytes(caller.tenant_id(), size as i64 - old as i64)
        .await?;
    Ok(HttpResponse::Created().json(ObjectInfo {
        path: rel,
        size,
        etag: String::new(),
    }))
}

#[utoipa::path(params(("bucket" = String, Path), ("path" = String, Path)), responses((status = 200, content_type = "application/octet-stream"), (status = 404, body = ErrorBody)))]
#[get("/objects/{bucket}/{path:.*}")]
#[tracing::instrument(skip(state, caller))]
pub async fn get_object(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (bucket, path) = path.into_inner();
    let (bucket, key, _) = user_object(&state, &caller, &bucket, &path, false)?;
    let (size, body) = state.storage.backend.get(&bucket, &key).await?;
    Ok(stream_object(size, body))
}

#[utoipa::path(params(("bucket" = String, Path), ("path" = String, Path)), responses((status = 204), (status = 403, body = ErrorBody)))]
#[delete("/objects/{bucket}/{path:.*}")]
#[tracing::instrument(skip(state, caller))]
pub async fn delete_object(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (bucket, path) = path.into_inner();
    let (bucket, key, _) = user_object(&state, &caller, &bucket, &path, true)?;
    let backend = state.storage.backend.as_ref();
    let old = backend.size(&bucket, &key).await?;
    backend.delete(&bucket, &key).await?;
    if let Some(old) = old {
        state
            .store
            .add_storage_bytes(caller.tenant_id(), -(old as i64))
            .await?;
    }
    Ok(HttpResponse::NoContent().finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_headers_round_trip_through_the_tar_reader() {
        let long = format!("{}/model.pt", "d".repeat(120));
        let mut archive = Vec::new();
        for (p, body) in [
            ("a.txt", b"hello".to_vec()),
            (long.as_str(), vec![7u8; 700]),
        ] {
            archive.extend(tar_header(p, body.len() as u64, 1_700_000_000));
            archive.extend(&body);
            archive.resize(archive.len() + padding(body.len() as u64), 0);
        }
        archive.extend([0u8; 1024]);
        let mut r = tar::Archive::new(archive.as_slice());
        let got: Vec<(String, u64)> = r
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.path().unwrap().display().to_string(), e.size())
            })
            .collect();
        assert_eq!(got, vec![("a.txt".to_string(), 5), (long, 700)]);
    }
}
