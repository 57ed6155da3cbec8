//! A client's key that makes retrying a submission safe.

use super::DomainError;

/// A client's key that makes retrying a submission safe (the `Idempotency-Key` header): 1 to
/// 128 printable ASCII characters with no blank at either end (HTTP already drops the blanks
/// around a header's value; the API's contract states the same rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(raw: &str) -> Result<Self, DomainError> {
        if !super::names::is_idempotency_key(raw) {
            return Err(DomainError::Malformed(
                "Idempotency-Key must be 1 to 128 printable ASCII characters, with no blank at either end".into(),
            ));
        }
        Ok(IdempotencyKey(raw.to_owned()))
    }

    pub fn into_inner(self) -> String {
        self.0
    }
}
