//! Argon2id hashing. Hashing is deliberately slow, so it runs on the blocking pool rather than
//! stalling the async workers that serve other requests.

use argon2::password_hash::{
    rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString,
};
use argon2::Argon2;

use crate::error::ApiError;

pub async fn hash(password: String) -> Result<String, ApiError> {
    tokio::task::spawn_blocking(move || {
        let salt = SaltString::generate(&mut OsRng);
        Argon2::default()
            .hash_password(password.as_bytes(), &salt)
            .map(|h| h.to_string())
            .map_err(|e| anyhow::anyhow!("hashing failed: {e}"))
    })
    .await
    .map_err(|e| anyhow::anyhow!(e))?
    .map_err(ApiError::Internal)
}

/// `false` for a wrong password and for a stored hash that cannot be parsed.
pub async fn verify(password: String, stored: String) -> Result<bool, ApiError> {
    tokio::task::spawn_blocking(move || {
        let Ok(parsed) = PasswordHash::new(&stored) else {
            return false;
        };
        Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    })
    .await
    .map_err(|e| ApiError::Internal(anyhow::anyhow!(e)))
}

/// A hash of a random password, verified against when the account does not exist, so a login
/// for an unknown email takes as long as one with a wrong password and does not reveal which
/// emails have accounts.
pub async fn dummy_hash() -> Result<String, ApiError> {
    hash(crate::auth::secrets::random_hex(16)).await
}
