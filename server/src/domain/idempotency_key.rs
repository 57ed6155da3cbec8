//! A client's key that makes retrying a submission safe.

use crate::error::ApiError;

/// A client's key that makes retrying a submission safe (the `Idempotency-Key` header): 1 to
/// 128 printable ASCII characters, surrounding blanks ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(raw: &str) -> Result<Self, ApiError> {
        let k = raw.trim();
        if k.is_empty() || k.len() > 128 {
            return Err(ApiError::BadRequest(
                "Idempotency-Key must be 1 to 128 characters".into(),
            ));
        }
        if !k.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(ApiError::BadRequest(
                "Idempotency-Key must be printable ASCII".into(),
            ));
        }
        Ok(IdempotencyKey(k.to_owned()))
    }

    pub fn into_inner(self) -> String {
        self.0
    }
}
