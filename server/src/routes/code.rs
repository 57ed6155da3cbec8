//! Code bundles: uploaded by a member (the SDK and CLI pack a task's `workdir`), looked up
//! before an upload so an unchanged folder is sent once, downloaded by members and by the
//! agent that runs a task.

use actix_web::{get, post, web, HttpResponse};
use autodl_common::api::ErrorBody;
use bytes::BytesMut;
use futures_util::StreamExt;

use crate::agents::node_caller::NodeCaller;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::artifacts::stream_object;
use crate::state::AppState;
use crate::usecases::code;
use crate::usecases::runs::placed_on;
use autodl_common::api::CodeBundle;

/// Reads the whole upload, refusing it as soon as it is larger than a bundle may be.
async fn read_body(mut payload: web::Payload, max: u64) -> Result<bytes::Bytes, ApiError> {
    let mut buf = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::BadRequest(format!("reading the upload: {e}")))?;
        if (buf.len() + chunk.len()) as u64 > max {
            return Err(ApiError::PayloadTooLarge(format!(
                "a code bundle is at most {max} bytes packed; leave data, checkpoints and \
                 outputs out of it (.gitignore, .autodlignore) and read them from data_path"
            )));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

#[utoipa::path(
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "A .tar.gz, .tar or .zip of the folder"),
    responses((status = 201, body = CodeBundle), (status = 200, body = CodeBundle), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 413, body = ErrorBody), (status = 503, body = ErrorBody))
)]
#[post("/code")]
#[tracing::instrument(skip(state, caller, payload))]
pub async fn upload(
    state: web::Data<AppState>,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(payload, state.settings.code_max_bytes).await?;
    let stored = code::store(&state, caller.tenant_id(), bytes).await?;
    Ok(if stored.stored {
        HttpResponse::Created().json(stored)
    } else {
        HttpResponse::Ok().json(stored)
    })
}

#[utoipa::path(params(("id" = String, Path)), responses((status = 200, body = CodeBundle), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
#[get("/code/{id}")]
#[tracing::instrument(skip(state, caller))]
pub async fn show(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    match code::find(&state, caller.tenant_id(), &id).await? {
        Some(b) => Ok(HttpResponse::Ok().json(b)),
        None => Err(ApiError::NotFound(format!(
            "your organization has no code bundle {id}"
        ))),
    }
}

#[utoipa::path(params(("id" = String, Path)), responses((status = 200, content_type = "application/octet-stream"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
#[get("/code/{id}/archive")]
#[tracing::instrument(skip(state, caller))]
pub async fn download(
    state: web::Data<AppState>,
    caller: Caller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let hex = code::digest_of("id", &id)?;
    let (bucket, key) = state.storage.code_key(caller.tenant_id(), hex);
    let (size, body) = state.storage.backend.get(&bucket, &key).await?;
    Ok(stream_object(size, body))
}

#[utoipa::path(params(("id" = String, Path)), responses((status = 200, content_type = "application/octet-stream"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
#[get("/agent/tasks/{id}/code")]
#[tracing::instrument(skip(state, node), fields(node = %node.node.id))]
pub async fn for_agent(
    state: web::Data<AppState>,
    node: NodeCaller,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let t = placed_on(&state, &node.node.id, &id).await?;
    let id = t
        .spec
        .code
        .as_deref()
        .ok_or_else(|| ApiError::NotFound("the task has no code bundle".into()))?;
    let hex = code::digest_of("code", id)?;
    let (bucket, key) = state.storage.code_key(&t.tenant_id, hex);
    let (size, body) = state.storage.backend.get(&bucket, &key).await?;
    Ok(stream_object(size, body))
}
