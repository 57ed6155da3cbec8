//! People's accounts: signing up (a new organization, or joining one through an invitation),
//! confirming a sign-up by email, signing in and out, sessions and passwords. The rules of
//! who may sign in how live here; the routes shape answers and cookies.

use autodl_common::api::Role;

use crate::auth::secrets::{digest, new_id, random_hex};
use crate::auth::session::Claims;
use crate::auth::{password, Caller};
use crate::domain::{DomainError, Email, Password};
use crate::error::ApiError;
use crate::notify::email::outgoing;
use crate::state::AppState;
use crate::store::{SessionRecord, SignupRequestRecord, TenantRecord, UserRecord};

/// How long a sign-up confirmation link works.
const SIGNUP_LINK_MS: i64 = 24 * 3_600_000;

/// A sign-up's outcome: an account made, or (where the server sends email) a link sent.
pub enum SignUp {
    Made(UserRecord, TenantRecord),
    LinkSent,
}

/// Joins the organization that sent an invitation, with the invitation's role. The link must
/// be open, for this address, and its organization must allow password sign-in.
pub async fn join(
    state: &AppState,
    email: &Email,
    pw: Password,
    token: &str,
) -> Result<(UserRecord, TenantRecord), ApiError> {
    let now = state.clock.now_ms();
    let inv = state
        .store
        .invitation_by_token_hash(&digest(token))
        .await?
        .filter(|i| i.is_open(now))
        .ok_or_else(|| {
            ApiError::NotFound("this invitation link is invalid or has expired".into())
        })?;
    if !state.store.password_login(&inv.tenant_id).await? {
        return Err(ApiError::Forbidden(
            "this organization signs in with single sign-on: use its button on the sign-in \
             page instead of a password"
                .into(),
        ));
    }
    if inv.email != email.as_str() {
        return Err(ApiError::Refused {
            field: "email",
            message: "this invitation is for a different email address".into(),
        });
    }
    let tenant = state.store.tenant(&inv.tenant_id).await?.ok_or_else(|| {
        ApiError::invalid("invitation", "the inviting organization no longer exists")
    })?;
    let user = new_user(
        email,
        password::hash(pw.into_inner()).await?,
        &tenant.id,
        inv.role,
        now,
    );
    state.store.accept_invitation(&inv.id, &user, now).await?;
    Ok((user, tenant))
}

/// A new organization owned by the person signing up, or, where the server sends email, a
/// link to finish it.
pub async fn sign_up(
    state: &AppState,
    email: &Email,
    pw: Password,
    tenant_name: String,
) -> Result<SignUp, ApiError> {
    let now = state.clock.now_ms();
    if state.settings.confirms_signups() {
        ask_to_confirm(state, email, pw, tenant_name, now).await?;
        return Ok(SignUp::LinkSent);
    }
    if state.store.user_by_email(email.as_str()).await?.is_some() {
        return Err(ApiError::Conflict(
            "an account with this email already exists".into(),
        ));
    }
    let hash = password::hash(pw.into_inner()).await?;
    let (user, tenant) = new_organization(email, hash, tenant_name, now);
    state.store.create_tenant_with_owner(&tenant, &user).await?;
    Ok(SignUp::Made(user, tenant))
}

/// A sign-up where the server sends email: kept until the link sent to the address is
/// followed, and answered the same whether the address has an account (it is told so by
/// email instead) or not, so nobody learns who has one.
async fn ask_to_confirm(
    state: &AppState,
    email: &Email,
    pw: Password,
    tenant_name: String,
    now: i64,
) -> Result<(), ApiError> {
    // Hashed in both cases: the answer takes as long either way.
    let password_hash = password::hash(pw.into_inner()).await?;
    let site = state.settings.public_url();
    let (subject, body) = if state.store.user_by_email(email.as_str()).await?.is_some() {
        (
            "Your autodl account".to_owned(),
            format!(
                "Someone (perhaps you) asked to make an autodl account with this address, which \
                 already has one. Sign in at {site}/login.\n\nIf it was not you, nothing has \
                 changed and you need do nothing."
            ),
        )
    } else {
        let token = random_hex(32);
        state
            .store
            .create_signup_request(&SignupRequestRecord {
                token_hash: digest(&token),
                email: email.as_str().to_owned(),
                password_hash,
                tenant_name,
                created_at: now,
                expires_at: now + SIGNUP_LINK_MS,
            })
            .await?;
        (
            "Finish signing up to autodl".to_owned(),
            format!(
                "Follow this link within 24 hours to finish making your autodl account:\n\n\
                 {site}/signup/confirm?token={token}\n\nIf you did not ask for an account, \
                 ignore this email."
            ),
        )
    };
    let to = email.as_str().to_owned();
    state
        .store
        .queue_email(&outgoing(to, "auth.sign_up", subject, body, now))
        .await?;
    Ok(())
}

/// Finishes a sign-up from the link its email was sent: the organization and its owner are
/// made (once: the link is used up).
pub async fn confirm_sign_up(
    state: &AppState,
    token: &str,
) -> Result<(UserRecord, TenantRecord), ApiError> {
    let now = state.clock.now_ms();
    let r = state
        .store
        .take_signup_request(&digest(token), now)
        .await?
        .ok_or_else(|| {
            ApiError::NotFound(
                "this sign-up link is invalid, used or expired: sign up again".into(),
            )
        })?;
    if state.store.user_by_email(&r.email).await?.is_some() {
        return Err(ApiError::Conflict(
            "this address has an account already: sign in".into(),
        ));
    }
    let email = Email::parse(&r.email)?;
    let (user, tenant) = new_organization(&email, r.password_hash, r.tenant_name, now);
    state.store.create_tenant_with_owner(&tenant, &user).await?;
    Ok((user, tenant))
}

fn new_organization(
    email: &Email,
    password_hash: String,
    name: String,
    now: i64,
) -> (UserRecord, TenantRecord) {
    let tenant = TenantRecord {
        id: new_id(),
        name,
        created_at: now,
        trusted: false,
        internal: false,
    };
    let user = new_user(email, password_hash, &tenant.id, Role::Owner, now);
    (user, tenant)
}

fn new_user(email: &Email, hash: String, tenant_id: &str, role: Role, now: i64) -> UserRecord {
    UserRecord {
        id: new_id(),
        email: email.as_str().to_owned(),
        password_hash: hash,
        tenant_id: tenant_id.to_owned(),
        role,
        platform_admin: false,
        disabled: false,
        created_at: now,
    }
}

/// A new session for the user: its signed token and the claims it carries.
pub async fn open_session(
    state: &AppState,
    user: &UserRecord,
) -> Result<(String, Claims), ApiError> {
    let now = state.clock.now_ms();
    let ttl = state.sessions.ttl_secs;
    let session = SessionRecord {
        id: new_id(),
        user_id: user.id.clone(),
        created_at: now,
        expires_at: now + ttl * 1000,
        revoked: false,
    };
    state.store.create_session(&session).await?;
    let claims = Claims {
        sub: user.id.clone(),
        sid: session.id,
        csrf: random_hex(16),
        iat: now / 1000,
        exp: now / 1000 + ttl,
    };
    let token = state.sessions.issue(&claims)?;
    Ok((token, claims))
}

/// Why a password sign-in was refused, with the account it named (if any) for the audit
/// trail, and the error to answer.
pub struct Refused {
    pub user: Option<UserRecord>,
    pub reason: &'static str,
    pub error: ApiError,
}

/// Signs in with a password. The password is checked against a dummy hash when the address
/// has no account, so the answer takes as long either way.
pub async fn sign_in(
    state: &AppState,
    email: &Email,
    given: String,
) -> Result<Result<(UserRecord, TenantRecord), Refused>, ApiError> {
    let user = state.store.user_by_email(email.as_str()).await?;
    let stored = user
        .as_ref()
        .map(|u| u.password_hash.clone())
        .unwrap_or_else(|| state.dummy_hash.clone());
    let ok = password::verify(given, stored).await?;
    let user = match user {
        Some(u) if ok => u,
        user => {
            return Ok(Err(Refused {
                user,
                reason: "wrong email or password",
                error: ApiError::Unauthorized("wrong email or password".into()),
            }))
        }
    };
    if user.disabled {
        return Ok(Err(Refused {
            user: Some(user),
            reason: "account disabled",
            error: ApiError::Unauthorized("this account is disabled".into()),
        }));
    }
    // Platform admins and owners keep their password: the way back in when a provider is down
    // or misconfigured (an owner is never locked out of their own organization).
    if !user.platform_admin
        && user.role != Role::Owner
        && !state.store.password_login(&user.tenant_id).await?
    {
        return Ok(Err(Refused {
            user: Some(user),
            reason: "password sign-in is off for this organization",
            error: ApiError::Forbidden(
                "your organization signs in with single sign-on: use its button on the sign-in \
                 page"
                    .into(),
            ),
        }));
    }
    let tenant = state
        .store
        .tenant(&user.tenant_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("user {} has no tenant", user.id))?;
    Ok(Ok((user, tenant)))
}

/// Ends the caller's session, if they hold one (an API key is not a session).
pub async fn sign_out(state: &AppState, caller: &Caller) -> Result<(), ApiError> {
    if let Some(sid) = caller.session_id() {
        state.store.revoke_session(sid).await?;
    }
    Ok(())
}

/// Changes the caller's password, given the current one, and ends every other session of the
/// account.
pub async fn change_password(
    state: &AppState,
    caller: &Caller,
    current: String,
    new: &str,
) -> Result<(), ApiError> {
    let email = Email::parse(&caller.user.email)?;
    if !password::verify(current, caller.user.password_hash.clone()).await? {
        return Err(ApiError::Refused {
            field: "current_password",
            message: "the current password is wrong".into(),
        });
    }
    let new_pw = Password::parse(new, Some(&email)).map_err(|e| match e {
        DomainError::Invalid { message, .. } => ApiError::invalid("new_password", message),
        other => other.into(),
    })?;
    let hash = password::hash(new_pw.into_inner()).await?;
    state.store.set_password(&caller.user.id, &hash).await?;
    state.accounts_changed();
    state
        .store
        .revoke_user_sessions(&caller.user.id, caller.session_id())
        .await?;
    Ok(())
}
