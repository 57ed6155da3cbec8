//! Checkpoints, results and datasets in object storage.
//!
//! Agents upload through the server (they hold node credentials, never storage keys): an upload
//! is started, its files are streamed one by one into the tenant's prefix, and a commit checks
//! every file against the listing before the checkpoint becomes visible. The last N complete
//! checkpoints of a task are kept; the newest is handed to the task's next attempt.
//! Users list checkpoints and download results as a tar archive; their own objects
//! (datasets) are `routes::objects`'.

use actix_web::http::header::TryIntoHeaderValue;
use actix_web::{get, post, put, web, HttpResponse};
use autodl_common::agent::{
    ArtifactCommit, ArtifactCreated, ArtifactFile, ArtifactStart, DataFile, DataManifest,
};
use autodl_common::api::ErrorBody;
use autodl_common::tasks::Checkpoint;
use futures_util::StreamExt;

use crate::agents::node_caller::NodeCaller;
use crate::auth::Caller;
use crate::domain::rfc3339;
use crate::error::ApiError;
use crate::routes::attachment::attachment;
use crate::routes::json::Json;
use crate::state::AppState;
use crate::storage::tar;
use crate::storage::{clean_path, ByteStream};
use crate::usecases::reach::find;
use crate::usecases::runs::placed_on;
use crate::usecases::task_outputs;
use crate::usecases::uploads::{self, parse_rel, Committed};

/// Room for a manifest of `MAX_FILES` files with long paths.
const COMMIT_BODY_LIMIT: usize = 64 << 20;

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
    let a = task_outputs::checkpoint_for(&state, &node.node.id, &id).await?;
    let (size, body) = state
        .storage
        .backend
        .get(&a.bucket, &format!("{}{rel}", a.prefix))
        .await?;
    Ok(stream_object(size, body))
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
    let (bucket, prefix) = task_outputs::data_location(&state, &t)?;
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
    let (bucket, prefix) = task_outputs::data_location(&state, &t)?;
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
    let list: Vec<Checkpoint> = task_outputs::checkpoints(&state, &t.task)
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
    let (files, at) = task_outputs::results(&state, &t.task).await?;
    let mtime = (at / 1000).max(0) as u64;
    let (length, stream) = tar::archive(state.storage.backend.clone(), files, mtime);
    Ok(HttpResponse::Ok()
        .content_type("application/x-tar")
        .insert_header((actix_web::http::header::CONTENT_ENCODING, "identity"))
        .insert_header(attachment(&format!("{}-results.tar", t.task.id)))
        .no_chunking(length)
        .streaming(stream))
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
    let (files, _) = task_outputs::results(&state, &t.task).await?;
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
    let (files, _) = task_outputs::results(&state, &t.task).await?;
    // Only a file a manifest lists: the path cannot reach beyond this task's results.
    let file = files
        .into_iter()
        .find(|f| f.path == rel)
        .ok_or_else(|| ApiError::NotFound("no such result file".into()))?;
    let (size, body) = state.storage.backend.get(&file.bucket, &file.key).await?;
    let name = file.path.rsplit('/').next().unwrap_or("result");
    let mut res = stream_object(size, body);
    let disposition = attachment(name);
    res.headers_mut().insert(
        actix_web::http::header::CONTENT_DISPOSITION,
        disposition.try_into_value().map_err(anyhow::Error::from)?,
    );
    Ok(res)
}
