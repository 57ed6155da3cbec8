//! The JSON body extractor of the API.
//!
//! JSON does not tell integers from floats: `2048.0` is the integer 2048 to JSON Schema (and
//! to the OpenAPI document), while serde refuses it for an integer field. Bodies are read as
//! JSON values first, whole-numbered floats become integers, and only then is the request
//! type built, so every client that writes numbers its own way is understood.

use std::future::Future;
use std::pin::Pin;

use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::{Number, Value};

use crate::error::ApiError;

/// Largest body a route takes unless it sets its own [`JsonLimit`].
pub const DEFAULT_LIMIT: usize = 256 * 1024;

/// A route's body limit, as app data of its resource.
#[derive(Debug, Clone, Copy)]
pub struct JsonLimit(pub usize);

/// A JSON request body of type `T`.
#[derive(Debug)]
pub struct Json<T>(pub T);

impl<T> std::ops::Deref for Json<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> Json<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

/// Whole-numbered floats that fit become integers, recursively.
pub fn integral_numbers(v: &mut Value) {
    match v {
        Value::Number(n) if n.is_f64() => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0) {
                if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                    *n = Number::from(f as u64);
                } else if (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
                    *n = Number::from(f as i64);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_numbers),
        Value::Object(map) => map.values_mut().for_each(integral_numbers),
        _ => {}
    }
}

impl<T: DeserializeOwned + 'static> FromRequest for Json<T> {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let limit = req
            .app_data::<JsonLimit>()
            .or_else(|| req.app_data::<web::Data<JsonLimit>>().map(|d| d.get_ref()))
            .map_or(DEFAULT_LIMIT, |l| l.0);
        let json_type = req.mime_type().ok().flatten().is_some_and(|m| {
            m.subtype().as_str() == "json" || m.suffix().is_some_and(|s| s.as_str() == "json")
        });
        let declared = req
            .headers()
            .get(actix_web::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let method = req.method().as_str().to_owned();
        let pattern = req.match_pattern();
        let mut payload = payload.take();
        Box::pin(async move {
            if !json_type {
                return Err(ApiError::BadRequest(
                    "expected a JSON body (Content-Type: application/json)".into(),
                ));
            }
            if declared.is_some_and(|n| n > limit) {
                return Err(ApiError::PayloadTooLarge(
                    "request body is too large".into(),
                ));
            }
            let mut body = web::BytesMut::new();
            while let Some(chunk) = payload.next().await {
                let chunk = chunk
                    .map_err(|e| ApiError::BadRequest(format!("invalid request body: {e}")))?;
                if body.len() + chunk.len() > limit {
                    return Err(ApiError::PayloadTooLarge(
                        "request body is too large".into(),
                    ));
                }
                body.extend_from_slice(&chunk);
            }
            let mut value: Value = serde_json::from_slice(&body)
                .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))?;
            if let Some(pattern) = &pattern {
                crate::routes::openapi::check_body(&method, pattern, &value)?;
            }
            integral_numbers(&mut value);
            serde_json::from_value(value)
                .map(Json)
                .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn whole_floats_become_integers() {
        let mut v =
            json!({"memory": 2048.0, "cpu": 1.5, "n": [-3.0, 1e300, 7], "deep": {"x": 0.0}});
        integral_numbers(&mut v);
        assert_eq!(v["memory"], json!(2048));
        assert_eq!(v["cpu"], json!(1.5));
        assert_eq!(v["n"][0], json!(-3));
        assert!(v["n"][1].is_f64(), "too big for an integer: stays a float");
        assert_eq!(v["deep"]["x"], json!(0));
        #[derive(serde::Deserialize)]
        struct Spec {
            memory: u64,
            cpu: f64,
        }
        let s: Spec = serde_json::from_value(json!({"memory": 2048, "cpu": 2})).unwrap();
        assert_eq!((s.memory, s.cpu), (2048, 2.0));
    }
}
