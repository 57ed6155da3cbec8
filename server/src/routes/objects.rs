//! An organization's objects as HTTP: list, store (streamed, counted against the storage cap
//! as the bytes arrive), fetch and delete. The rules are `usecases::objects`'.

use actix_web::{delete, get, put, web, HttpRequest, HttpResponse};
use autodl_common::api::ErrorBody;
use serde::{Deserialize, Serialize};

use crate::audit::{self, Action, Actor};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::artifacts::stream_object;
use crate::state::AppState;
use crate::storage::usage;
use crate::usecases::objects;
use crate::usecases::uploads::{receive, ReceiveError};

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
    let (bucket, key) = match objects::user_object(&state, &caller, &bucket, prefix, false) {
        Ok((bucket, key, _)) => (bucket, key),
        // The whole area, or a prefix no object can be below (nothing to list).
        Err(ApiError::NotFound(_)) if prefix.trim_matches('/').is_empty() => {
            objects::tenant_key(&state, &caller, &bucket, "")?
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
    let (bucket, key, rel) = objects::user_object(&state, &caller, &bucket_name, &path, true)?;
    let backend = state.storage.backend.as_ref();
    // Replacing an object frees what it held.
    let previous = backend.size(&bucket, &key).await?;
    let existed = previous.is_some();
    let old = previous.unwrap_or(0);
    let room = objects::room(&state, &caller, old).await?;
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
    let mut quota = objects::reserve(&state, &caller, old).await?;
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
    let (bucket, key, _) = objects::user_object(&state, &caller, &bucket, &path, false)?;
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
    let (bucket, key, rel) = objects::user_object(&state, &caller, &bucket_name, &path, true)?;
    let backend = state.storage.backend.as_ref();
    let old = backend.size(&bucket, &key).await?;
    backend.delete(&bucket, &key).await?;
    if let Some(old) = old {
        objects::freed(&state, &caller, old).await?;
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
