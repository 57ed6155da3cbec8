//! The `Caller` extractor: resolves a session cookie, a Bearer session token or an API key to
//! a user acting inside their tenant, and refuses everything else.

use std::future::Future;
use std::pin::Pin;

use actix_web::http::Method;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};
use autodl_common::api::Role;

use super::secrets::{digest, API_KEY_PREFIX};
use super::session::{Claims, CSRF_HEADER, SESSION_COOKIE};
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::UserRecord;

#[derive(Debug, Clone)]
pub enum CallerVia {
    /// `from_cookie`: the browser sent it by itself, so CSRF checks apply.
    Session {
        sid: String,
        from_cookie: bool,
    },
    ApiKey {
        id: String,
    },
}

#[derive(Debug, Clone)]
pub struct Caller {
    pub user: UserRecord,
    pub role: Role,
    pub via: CallerVia,
}

/// A refreshed session token for the response, left by the extractor for the renewal
/// middleware (extractors cannot set response cookies themselves).
#[derive(Debug, Clone)]
pub struct RenewedSession {
    pub token: String,
    pub csrf: String,
}

/// API keys record their last use at most this often, so a busy program does not turn every
/// read into a write.
const TOUCH_INTERVAL_MS: i64 = 60_000;

impl Caller {
    pub fn tenant_id(&self) -> &str {
        &self.user.tenant_id
    }

    pub fn require_manager(&self) -> Result<(), ApiError> {
        if self.role.can_manage() || self.user.platform_admin {
            Ok(())
        } else {
            Err(ApiError::Forbidden(
                "this needs the owner or admin role in your organization".into(),
            ))
        }
    }

    /// How people sign in (single sign-on, passwords) is the owners' to decide: an admin who
    /// could set a provider could sign in as anyone it names.
    pub fn require_owner(&self) -> Result<(), ApiError> {
        if self.role == Role::Owner || self.user.platform_admin {
            Ok(())
        } else {
            Err(ApiError::Forbidden(
                "only an owner of your organization changes how people sign in".into(),
            ))
        }
    }

    pub fn require_platform_admin(&self) -> Result<(), ApiError> {
        if self.user.platform_admin {
            Ok(())
        } else {
            Err(ApiError::Forbidden(
                "this needs a platform administrator".into(),
            ))
        }
    }

    pub fn session_id(&self) -> Option<&str> {
        match &self.via {
            CallerVia::Session { sid, .. } => Some(sid),
            CallerVia::ApiKey { .. } => None,
        }
    }
}

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Caller, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move { authenticate(&req).await })
    }
}

/// A caller re-checked during a long-lived response (a live stream): a revoked session or
/// key, a disabled or removed member ends it within [`LiveCaller::EVERY`].
pub struct LiveCaller {
    caller: Caller,
    /// When (by the clock) it was last checked.
    checked: i64,
}

impl LiveCaller {
    pub const EVERY: std::time::Duration = std::time::Duration::from_secs(2);

    /// `now_ms`: when the caller was authenticated, by the server's clock.
    pub fn new(caller: Caller, now_ms: i64) -> Self {
        LiveCaller {
            caller,
            checked: now_ms,
        }
    }

    /// Whether the caller may still read; looks at the store at most every `EVERY`.
    pub async fn still_allowed(&mut self, state: &AppState) -> bool {
        let now = state.clock.now_ms();
        if !crate::clock::due(Some(self.checked), now, Self::EVERY) {
            return true;
        }
        self.checked = now;
        holds(state, &self.caller.user.id, &self.caller.via).await
            && state
                .store
                .user(&self.caller.user.id)
                .await
                .ok()
                .flatten()
                .is_some_and(|u| !u.disabled && u.tenant_id == self.caller.user.tenant_id)
    }
}

/// Whether the sign-in `via` still stands for `user_id`: the session neither ended nor
/// expired, the key neither revoked nor expired.
async fn holds(state: &AppState, user_id: &str, via: &CallerVia) -> bool {
    let now = state.clock.now_ms();
    match via {
        CallerVia::Session { sid, .. } => state
            .store
            .session(sid)
            .await
            .ok()
            .flatten()
            .is_some_and(|s| !s.revoked && s.expires_at > now && s.user_id == user_id),
        CallerVia::ApiKey { id } => state.store.list_api_keys(user_id).await.is_ok_and(|keys| {
            keys.iter()
                .any(|k| k.id == *id && !k.revoked && k.expires_at.is_none_or(|e| e > now))
        }),
    }
}

/// The caller a credential made earlier acts for now (a pass into a task's app carries who
/// made it and how): refused once that sign-in ended or the account was disabled, so
/// signing out or revoking the key ends what it opened.
pub async fn resume(state: &AppState, user_id: &str, via: CallerVia) -> Result<Caller, ApiError> {
    if !holds(state, user_id, &via).await {
        return Err(ApiError::Unauthorized(
            "the sign-in this was opened with has ended; open it again from the task's page".into(),
        ));
    }
    let user = active_user(state, user_id).await?;
    Ok(Caller {
        role: user.role,
        user,
        via,
    })
}

/// The last event of a live stream whose caller lost access.
pub const STREAM_REVOKED: &[u8] = b"event: end\ndata: {\"reason\":\"access revoked\"}\n\n";

/// Renews the session of a page request that carries one, as an API call would: a researcher
/// who reads pages without JavaScript (every read then happens on the server) stays signed in
/// while active. The page's own reads of the API then carry the renewed token (see
/// [`session_cookie_for_reads`]) rather than each renewing the old one again.
pub async fn renew_page_session(req: &HttpRequest) {
    let Some(state) = req.app_data::<web::Data<AppState>>() else {
        return;
    };
    let now = state.clock.now_ms();
    let due = req.method() == Method::GET
        && req
            .headers()
            .get(actix_web::http::header::AUTHORIZATION)
            .is_none()
        && req
            .cookie(SESSION_COOKIE)
            .and_then(|c| state.sessions.verify(c.value(), now))
            .is_some_and(|claims| renewal_due(state, &claims, now));
    // Only then is the store asked (most page loads are not near the session's end); a
    // missing or ended session is the page's own business (it shows the signed-out view).
    if due {
        let _ = authenticate(req).await;
    }
}

/// Sessions are renewed in their second half, so an active user never meets the expiry.
fn renewal_due(state: &AppState, claims: &Claims, now_ms: i64) -> bool {
    claims.exp * 1000 - now_ms < state.sessions.ttl_secs * 1000 / 2
}

/// The session cookie a page's reads should carry: the one renewed for this request, if any.
pub fn session_cookie_for_reads(req: &HttpRequest) -> Option<String> {
    req.extensions()
        .get::<RenewedSession>()
        .map(|r| format!("{SESSION_COOKIE}={}", r.token))
}

async fn authenticate(req: &HttpRequest) -> Result<Caller, ApiError> {
    let state = req
        .app_data::<web::Data<AppState>>()
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("app state missing")))?;
    let now = state.clock.now_ms();

    use super::bearer::{bearer, Bearer};
    if let Some(token) = match bearer(req.headers()) {
        Bearer::Absent => None,
        Bearer::Malformed => {
            return Err(ApiError::Unauthorized(
                "expected `Authorization: Bearer <token>`".into(),
            ))
        }
        Bearer::Token(t) => Some(t),
    } {
        if token.starts_with(API_KEY_PREFIX) {
            return from_api_key(state, token, now).await;
        }
        let claims = state
            .sessions
            .verify(token, now)
            .ok_or_else(|| ApiError::Unauthorized("invalid or expired token".into()))?;
        return from_session(state, claims, false, now).await;
    }

    let cookie = req.cookie(SESSION_COOKIE).ok_or_else(|| {
        ApiError::Unauthorized("sign in, or send an API key as a Bearer token".into())
    })?;
    let claims = state
        .sessions
        .verify(cookie.value(), now)
        .ok_or_else(|| ApiError::Unauthorized("your session has expired; sign in again".into()))?;
    if !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        let sent = req.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok());
        if sent != Some(claims.csrf.as_str()) {
            return Err(ApiError::Forbidden("missing or wrong CSRF token".into()));
        }
    }
    let renew = renewal_due(state, &claims, now);
    let caller = from_session(state, claims.clone(), true, now).await?;
    if renew {
        let exp = now / 1000 + state.sessions.ttl_secs;
        let fresh = Claims {
            iat: now / 1000,
            exp,
            ..claims
        };
        let token = state.sessions.issue(&fresh)?;
        state.store.extend_session(&fresh.sid, exp * 1000).await?;
        req.extensions_mut().insert(RenewedSession {
            token,
            csrf: fresh.csrf,
        });
    }
    Ok(caller)
}

async fn from_session(
    state: &AppState,
    claims: Claims,
    from_cookie: bool,
    now: i64,
) -> Result<Caller, ApiError> {
    let session = state
        .store
        .session(&claims.sid)
        .await?
        .filter(|s| !s.revoked && s.expires_at > now && s.user_id == claims.sub)
        .ok_or_else(|| ApiError::Unauthorized("this session has ended; sign in again".into()))?;
    let user = active_user(state, &session.user_id).await?;
    Ok(Caller {
        role: user.role,
        user,
        via: CallerVia::Session {
            sid: session.id,
            from_cookie,
        },
    })
}

async fn from_api_key(state: &AppState, token: &str, now: i64) -> Result<Caller, ApiError> {
    let hash = digest(token);
    let found = state
        .accounts
        .api_key(state.store.as_ref(), &hash)
        .await?
        .ok_or_else(|| ApiError::Unauthorized("unknown API key".into()))?;
    let key = found.key;
    if key.revoked {
        return Err(ApiError::Unauthorized(
            "this API key has been revoked".into(),
        ));
    }
    if key.expires_at.is_some_and(|e| e <= now) {
        return Err(ApiError::Unauthorized("this API key has expired".into()));
    }
    let user = usable(found.user)?;
    if key.last_used_at.is_none_or(|t| now - t > TOUCH_INTERVAL_MS) {
        state.store.touch_api_key(&key.id, now).await?;
        state.accounts.key_used(&hash, now);
    }
    Ok(Caller {
        role: user.role,
        user,
        via: CallerVia::ApiKey { id: key.id },
    })
}

async fn active_user(state: &AppState, id: &str) -> Result<UserRecord, ApiError> {
    usable(state.store.user(id).await?)
}

/// The user a credential acts for, if they may still act.
fn usable(user: Option<UserRecord>) -> Result<UserRecord, ApiError> {
    let user = user.ok_or_else(|| ApiError::Unauthorized("account not found".into()))?;
    if user.disabled {
        return Err(ApiError::Unauthorized("this account is disabled".into()));
    }
    Ok(user)
}

pub fn parse_role(s: &str) -> Result<Role, ApiError> {
    Role::parse(s)
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("stored role {s:?} is unknown")))
}
