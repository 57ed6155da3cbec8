//! One error type for every handler, mapped to a status and the JSON error body.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use autodl_common::api::{ErrorBody, ErrorDetail};

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{message}")]
    Validation {
        field: Option<std::borrow::Cow<'static, str>>,
        message: String,
    },
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    /// Refused although well formed, about one field (a wrong current password, an action on
    /// oneself that nobody may take): 403 with the field, so forms show it in place.
    #[error("{message}")]
    Refused {
        field: &'static str,
        message: String,
    },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    /// Well formed, but it contradicts an earlier request it claims to repeat (an idempotency
    /// key used again with a different body).
    #[error("{0}")]
    Unprocessable(String),
    /// The request can never run on this cluster (admission check).
    #[error("{0}")]
    Unschedulable(String),
    /// Over a quota that is checked at submission (GPU types, queued tasks).
    #[error("{0}")]
    Quota(String),
    #[error("{0}")]
    NoResults(String),
    /// Object storage did not answer or failed; the caller may retry.
    #[error("{0}")]
    StorageUnavailable(String),
    /// The database cannot write for now (full or read-only disk); the caller may retry.
    #[error("{0}; try again later")]
    DatabaseUnavailable(crate::store::fault::StoreFault),
    /// Something past this server that should answer did not (a task's node or its app).
    #[error("{0}")]
    BadGateway(String),
    #[error("too many attempts; try again in {retry_after_secs} s")]
    RateLimited { retry_after_secs: u64 },
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

impl ApiError {
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        ApiError::Validation {
            field: Some(std::borrow::Cow::Borrowed(field)),
            message: message.into(),
        }
    }

    fn code(&self) -> &'static str {
        match self {
            ApiError::Validation { .. } => "validation",
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) | ApiError::Refused { .. } => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::Conflict(_) => "conflict",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::Unprocessable(_) => "unprocessable",
            ApiError::Unschedulable(_) => "unschedulable",
            ApiError::Quota(_) => "quota",
            ApiError::NoResults(_) => "no_results",
            ApiError::StorageUnavailable(_) => "storage_unavailable",
            ApiError::DatabaseUnavailable(_) => "database_unavailable",
            ApiError::BadGateway(_) => "bad_gateway",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::Internal(_) => "internal",
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => ApiError::NotFound("not found".into()),
            StoreError::Conflict(what) => ApiError::Conflict(what),
            StoreError::Unavailable(fault) => ApiError::DatabaseUnavailable(fault),
            other => ApiError::Internal(other.into()),
        }
    }
}

impl From<crate::storage::StorageError> for ApiError {
    fn from(e: crate::storage::StorageError) -> Self {
        use crate::storage::StorageError as S;
        match e {
            S::NotFound => ApiError::NotFound("no such object".into()),
            S::NoBucket(b) => ApiError::BadRequest(format!("bucket {b:?} does not exist")),
            S::Unavailable(m) => {
                tracing::warn!(error = m, "object storage unavailable");
                ApiError::StorageUnavailable("object storage is unavailable; try again".into())
            }
            S::Conflict(m) => ApiError::Conflict(m),
            S::Other(m) => ApiError::Internal(anyhow::anyhow!(m)),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Validation { .. } | ApiError::BadRequest(_) | ApiError::Unschedulable(_) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::Quota(_) => StatusCode::FORBIDDEN,
            ApiError::NoResults(_) => StatusCode::NOT_FOUND,
            ApiError::StorageUnavailable(_) | ApiError::DatabaseUnavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) | ApiError::Refused { .. } => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::BadGateway(_) => StatusCode::BAD_GATEWAY,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let ApiError::Internal(e) = self {
            // The cause goes to the log, never to the caller.
            tracing::error!(error = ?e, "internal error");
        }
        let field = match self {
            ApiError::Validation { field, .. } => field.as_ref().map(|f| f.to_string()),
            ApiError::Refused { field, .. } => Some((*field).to_owned()),
            _ => None,
        };
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code().to_owned(),
                message: self.to_string(),
                field,
            },
        };
        let mut res = HttpResponse::build(self.status_code());
        if let ApiError::RateLimited { retry_after_secs } = self {
            res.insert_header((header::RETRY_AFTER, retry_after_secs.to_string()));
        }
        if let ApiError::Unauthorized(_) = self {
            res.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        res.json(body)
    }
}

pub fn path_error_handler(
    err: actix_web::error::PathError,
    _req: &actix_web::HttpRequest,
) -> actix_web::Error {
    ApiError::BadRequest(format!("invalid path: {err}")).into()
}

pub fn query_error_handler(
    err: actix_web::error::QueryPayloadError,
    _req: &actix_web::HttpRequest,
) -> actix_web::Error {
    ApiError::BadRequest(format!("invalid query: {err}")).into()
}

impl From<crate::domain::DomainError> for ApiError {
    fn from(e: crate::domain::DomainError) -> Self {
        use crate::domain::DomainError;
        match e {
            DomainError::Invalid { field, message } => ApiError::invalid(field, message),
            DomainError::Refused { field, message } => ApiError::Refused { field, message },
            DomainError::Malformed(message) => ApiError::BadRequest(message),
            DomainError::OverQuota(message) => ApiError::Quota(message),
        }
    }
}
