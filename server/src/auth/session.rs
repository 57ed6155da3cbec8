//! Browser sessions: a signed JWT naming a stored session row.
//!
//! The JWT alone would be valid until it expires; the row lets logout and password changes end
//! a session at once. The token also carries a CSRF secret, mirrored in a cookie that page
//! scripts can read and must echo in `X-CSRF-Token` on state-changing requests (double submit).

use actix_web::cookie::{time::Duration as CookieDuration, Cookie, SameSite};
use jsonwebtoken::{decode, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

pub const SESSION_COOKIE: &str = "autodl_session";
pub const CSRF_COOKIE: &str = "autodl_csrf";
pub const CSRF_HEADER: &str = "x-csrf-token";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub sid: String,
    pub csrf: String,
    /// Seconds since the epoch, as RFC 7519 wants.
    pub iat: i64,
    pub exp: i64,
}

/// A token given to a running task so its code can report metrics for that task alone.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskClaims {
    pub sub: String,
    pub task: String,
    /// Good only while this attempt is the task's current one and runs.
    pub attempt: u32,
    pub exp: i64,
}

pub struct SessionKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    pub ttl_secs: i64,
    pub secure: bool,
}

impl SessionKeys {
    pub fn new(secret: &[u8], ttl_secs: u64, secure: bool) -> Self {
        SessionKeys {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            ttl_secs: ttl_secs as i64,
            secure,
        }
    }

    pub fn issue(&self, claims: &Claims) -> anyhow::Result<String> {
        Ok(encode(
            &Header::new(Algorithm::HS256),
            claims,
            &self.encoding,
        )?)
    }

    /// Checks signature and algorithm, and expiry at `now_ms` by the server's `Clock` (no
    /// leeway: an expired session is expired), as everything else time-bound is judged.
    pub fn verify(&self, token: &str, now_ms: i64) -> Option<Claims> {
        decode::<Claims>(token, &self.decoding, &signed_only())
            .ok()
            .map(|d| d.claims)
            .filter(|c| c.exp * 1000 > now_ms)
    }

    pub fn issue_task_token(
        &self,
        task: &str,
        user: &str,
        attempt: u32,
        exp: i64,
    ) -> anyhow::Result<String> {
        let claims = TaskClaims {
            sub: user.to_owned(),
            task: task.to_owned(),
            attempt,
            exp,
        };
        Ok(encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &self.encoding,
        )?)
    }

    pub fn verify_task_token(&self, token: &str, now_ms: i64) -> Option<TaskClaims> {
        decode::<TaskClaims>(token, &self.decoding, &signed_only())
            .ok()
            .map(|d| d.claims)
            .filter(|c| c.exp * 1000 > now_ms)
    }

    pub fn cookies(&self, token: &str, csrf: &str) -> [Cookie<'static>; 2] {
        let max_age = CookieDuration::seconds(self.ttl_secs);
        let session = Cookie::build(SESSION_COOKIE, token.to_owned())
            .path("/")
            .http_only(true)
            .same_site(SameSite::Lax)
            .secure(self.secure)
            .max_age(max_age)
            .finish();
        let csrf = Cookie::build(CSRF_COOKIE, csrf.to_owned())
            .path("/")
            .http_only(false)
            .same_site(SameSite::Lax)
            .secure(self.secure)
            .max_age(max_age)
            .finish();
        [session, csrf]
    }

    pub fn removal_cookies(&self) -> [Cookie<'static>; 2] {
        let mut a = Cookie::build(SESSION_COOKIE, "")
            .path("/")
            .http_only(true)
            .finish();
        a.make_removal();
        let mut b = Cookie::build(CSRF_COOKIE, "").path("/").finish();
        b.make_removal();
        [a, b]
    }
}

/// Signature, algorithm and the claims a token must carry; expiry is judged by the caller
/// against the server's `Clock`, not the library against the wall clock.
pub(crate) fn signed_only() -> Validation {
    let mut v = Validation::new(Algorithm::HS256);
    v.validate_exp = false;
    v.set_required_spec_claims(&["exp", "sub"]);
    v
}
