//! Random secrets (API keys, invitation tokens) and their stored digests.
//!
//! These secrets carry 192 bits of randomness, so a fast SHA-256 digest is enough to store them:
//! unlike passwords they cannot be guessed, and the digest lets us look a key up by value.

use rand::RngCore;
use sha2::{Digest, Sha256};

pub const API_KEY_PREFIX: &str = "adl_";
/// How many leading characters of a key are kept in clear to recognise it in a list.
pub const SHOWN_PREFIX_LEN: usize = 12;

pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut buf);
    hex::encode(buf)
}

pub fn new_api_key() -> String {
    format!("{API_KEY_PREFIX}{}", random_hex(24))
}

pub fn digest(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A task's id: it sorts as tasks were created (UUIDv7, ordered within this process), so where
/// the policy breaks a tie by id it breaks it by age, as the simulator's arrival-ordered ids do.
pub fn time_ordered_id() -> String {
    uuid::Uuid::now_v7().to_string()
}
