//! Checkpoints, results and datasets in object storage.
//!
//! Agents upload through the server (they hold node credentials, never storage keys): an upload
//! is started, its files are streamed one by one into the tenant's prefix, and a commit checks
//! every file against the listing before the checkpoint becomes visible. The last N complete
//! checkpoints of a task are kept; the newest is handed to the task's next attempt.
//! Users list checkpoints, download results as a tar archive, and keep datasets under
//! `/objects`, always inside their own tenant's prefix.

use actix_web::{delete, get, post, put, web, HttpRequest, HttpResponse};
use autodl_common::agent::{
    ArtifactCommit, ArtifactCreated, ArtifactFile, ArtifactStart, DataFile, DataManifest,
};
use autodl_common::api::ErrorBody;
use autodl_common::tasks::Checkpoint;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::agents::node_caller::NodeCaller;
use crate::audit::{self, Action, Actor};
use crate::auth::Caller;
use crate::domain::rfc3339;
use crate::domain::{ArtifactKind, ArtifactState};
use crate::error::ApiError;
use crate::routes::json::Json;
use crate::state::AppState;
use crate::storage::tar::{self, Entry};
use crate::storage::{clean_path, usage, ByteStream};
use crate::store::TaskRecord;
use crate::tasks::results as task_results;
use crate::tasks::spec_of;
use crate::usecases::reach::find;
use crate::usecases::runs::placed_on;
use crate::usecases::runs::rank0_node;
use crate::usecases::uploads::{
    self, check_key, not_writable, parse_rel, receive, Committed, ReceiveError,
};

/// Room for a manifest of `MAX_FILES` files with long paths.
const COMMIT_BODY_LIMIT: usize = 64 << 20;

/// Who may change an organization's objects, one rule for storing, replacing and deleting:
/// every member, anywhere but `checkpoints/` and `results/`, which hold what the platform saved
/// for tasks (users read them, only agents write there), and `code/`, whose bundles are named
/// by their digest (a replaced bundle would change what another member's task runs).
fn may_write_objects(_caller: &Caller, rel: &str) -> Result<(), ApiError> {
    let top = rel.split('/').next().unwrap_or_default();
    if top == "checkpoints" || top == "results" || top == "code" {
        return Err(ApiError::Forbidden(format!(
            "{top}/ holds what the platform saved for tasks; it is read-only"
        )));
    }
    Ok(())
}

/// A path no file can have, asked for: there is no such file.
fn no_such_file(_: ApiError) -> ApiError {
    ApiError::NotFound("no such file".into())
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
    let id = uploads::start(&state, &node.node.id, &id, &body).await?;
    Ok(HttpResponse::Created().json(ArtifactCreated { id }))
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
    uploads::abandon(&state, &node.node.id, &id).await?;
    Ok(HttpResponse::NoContent().finish())
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
    uploads::put_file(&state, &node.node.id, &id, &rel, &mut payload).await?;
    Ok(HttpResponse::NoContent().finish())
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
    let done = uploads::commit(&state, &node.node.id, &id, body.files).await?;
    Ok(HttpResponse::Ok().json(done))
}

/// Streams one object as the response body.
pub(crate) fn stream_object(size: u64, body: ByteStream) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/octet-stream")
        // Already the bytes to send: keep the compression middleware (and its CPU) off them.
        .insert_header((actix_web::http::header::CONTENT_ENCODING, "identity"))
        .no_chunking(size)
        .streaming(body)
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
    placed_on(&state, &node.node.id, &a.task_id).await?;
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
    let t = placed_on(&state, &node.node.id, &id).await?;
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

#[utoipa::path(params(("id" = String, Path), ("path" = String, Path)), responses((status = 200, content_type = "application/octet-stream"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[get("/agent/tasks/{id}/data/files/{path:.*}")]
#[tracing::instrument(skip(state, node), fields(node = %node.node.id))]
pub async fn data_file(
    state: web::Data<AppState>,
    node: NodeCaller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (id, rel) = path.into_inner();
    let rel = clean_path(&rel).map_err(|_| ApiError::NotFound("no such file".into()))?;
    let t = placed_on(&state, &node.node.id, &id).await?;
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

/// The task's results as a tar archive, streamed from object storage file by file.
#[utoipa::path(params(("id" = String, Path)), responses((status = 200, content_type = "application/x-tar"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[get("/tasks/{id}/results")]
#[tracing::instrument(skip(state, caller))]
pub async fn results(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let t = find(&state, &caller, &id).await?;
    let (files, at) = results_of(&state, &t.task).await?;
    let mtime = (at / 1000).max(0) as u64;
    let (length, stream) = tar::archive(state.storage.backend.clone(), files, mtime);
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

/// The files of the task's results (every node's of its newest attempt with results, rank 0's
/// node's first: [`task_results::tree`]) and when the newest was stored, or why there are none.
async fn results_of(state: &AppState, t: &TaskRecord) -> Result<(Vec<Entry>, i64), ApiError> {
    if t.results.as_deref() == Some(crate::tasks::lifecycle::RESULTS_UPLOADING) {
        return Err(ApiError::Conflict(format!(
            "the results of task {} are still uploading: its run ended while the server or storage was away, and its node keeps them until they are stored",
            t.id
        )));
    }
    if t.results.as_deref() == Some(crate::tasks::lifecycle::RESULTS_LOST) {
        return Err(ApiError::NoResults(format!(
            "the results of task {} could not be kept (its timeline says why)",
            t.id
        )));
    }
    // The last attempt's only: a gang's node may have saved its part of an attempt that
    // then failed.
    let (current, _) = task_results::current(
        state
            .store
            .task_artifacts(&t.id, ArtifactKind::Results)
            .await?
            .into_iter()
            .filter(|a| a.attempt == t.attempts)
            .collect(),
    );
    let Some(newest) = current.first() else {
        return Err(ApiError::NoResults(format!(
            "task {} has no results (files it leaves in AUTODL_RESULTS_DIR are kept when it completes)",
            t.id
        )));
    };
    let at = current
        .iter()
        .map(|a| a.completed_at.unwrap_or(a.created_at))
        .max()
        .unwrap_or_default();
    let rank0 = if current.len() > 1 {
        rank0_node(state, &t.id, newest.attempt).await?
    } else {
        None
    };
    Ok((task_results::tree(&current, rank0.as_deref()), at))
}

/// The files among the task's results, to pick one instead of fetching them all.
#[utoipa::path(params(("id" = String, Path)), responses((status = 200, body = Vec<autodl_common::agent::ArtifactFile>), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[get("/tasks/{id}/results/files")]
#[tracing::instrument(skip(state, caller))]
pub async fn result_files(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let t = find(&state, &caller, &id).await?;
    let (files, _) = results_of(&state, &t.task).await?;
    let files: Vec<ArtifactFile> = files
        .into_iter()
        .map(|f| ArtifactFile {
            path: f.path,
            size: f.size,
        })
        .collect();
    Ok(HttpResponse::Ok().json(files))
}

/// One result file. Always sent as a download of bytes: a task's output is never shown as a
/// page of this site (it could be HTML written to run in the viewer's session).
#[utoipa::path(params(("id" = String, Path), ("path" = String, Path)), responses((status = 200, content_type = "application/octet-stream"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[get("/tasks/{id}/results/files/{path:.*}")]
#[tracing::instrument(skip(state, caller))]
pub async fn result_file(
    state: web::Data<AppState>,
    caller: Caller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (id, rel) = path.into_inner();
    let t = find(&state, &caller, &id).await?;
    let (files, _) = results_of(&state, &t.task).await?;
    // Only a file a manifest lists: the path cannot reach beyond this task's results.
    let file = files
        .into_iter()
        .find(|f| f.path == rel)
        .ok_or_else(|| ApiError::NotFound("no such result file".into()))?;
    let (size, body) = state.storage.backend.get(&file.bucket, &file.key).await?;
    let name: String = file
        .path
        .rsplit('/')
        .next()
        .unwrap_or("result")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut res = stream_object(size, body);
    res.headers_mut().insert(
        actix_web::http::header::CONTENT_DISPOSITION,
        actix_web::http::header::HeaderValue::from_str(&format!("attachment; filename=\"{name}\""))
            .map_err(anyhow::Error::from)?,
    );
    Ok(res)
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
    let (bucket_name, path) = path.into_inner();
    let (bucket, key, rel) = user_object(&state, &caller, &bucket_name, &path, true)?;
    let backend = state.storage.backend.as_ref();
    // Replacing an object frees what it held.
    let previous = backend.size(&bucket, &key).await?;
    let existed = previous.is_some();
    let old = previous.unwrap_or(0);
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
    let up = backend.start_upload(&bucket, &key).await?;
    // Counted as the bytes arrive: concurrent uploads never pass the cap together.
    let mut quota = usage::Reservation::new(state.store.as_ref(), caller.tenant_id(), old).await?;
    let received = receive(
        up,
        &mut payload,
        max_object,
        || ApiError::PayloadTooLarge(format!("objects are at most {max_object} bytes")),
        &mut quota,
    )
    .await;
    // A failed write leaves the old object as it was (nothing was replaced).
    quota.finish(received.as_ref().map_or(old, |n| *n)).await?;
    let size = received.map_err(|e| match e {
        ReceiveError::Request(e) => e,
        ReceiveError::Storage(e) => e.into(),
    })?;
    if existed {
        // The organization's objects are shared: who replaced which is on record.
        audit::record(
            &state,
            Actor::of(&caller, &req),
            Some(caller.tenant_id()),
            Action::ObjectReplaced,
            &format!("object {bucket_name}/{rel}"),
            serde_json::json!({ "size": size, "old_size": old }),
        )
        .await;
    }
    Ok(HttpResponse::Created().json(ObjectInfo {
        path: rel,
        size,
        etag: String::new(),
    }))
}

#[utoipa::path(params(("bucket" = String, Path), ("path" = String, Path)), responses((status = 200, content_type = "application/octet-stream"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
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
    req: HttpRequest,
    caller: Caller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (bucket_name, path) = path.into_inner();
    let (bucket, key, rel) = user_object(&state, &caller, &bucket_name, &path, true)?;
    let backend = state.storage.backend.as_ref();
    let old = backend.size(&bucket, &key).await?;
    backend.delete(&bucket, &key).await?;
    if let Some(old) = old {
        state
            .store
            .add_storage_bytes(caller.tenant_id(), -(old as i64))
            .await?;
        audit::record(
            &state,
            Actor::of(&caller, &req),
            Some(caller.tenant_id()),
            Action::ObjectDeleted,
            &format!("object {bucket_name}/{rel}"),
            serde_json::json!({ "size": old }),
        )
        .await;
    }
    Ok(HttpResponse::NoContent().finish())
}
