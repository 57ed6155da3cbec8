use actix_web::{get, post, web, HttpRequest, HttpResponse};
use autodl_common::api::{
    ErrorBody, LoginRequest, LoginResponse, Me, PasswordChangeRequest, SignupConfirmRequest,
    SignupPending, SignupRequest,
};

use crate::audit::{self, Action, Actor};
use crate::auth::secrets::{digest, new_id, random_hex};
use crate::auth::session::Claims;
use crate::auth::{password, Caller};
use crate::domain::{parse_name, Email, Password};
use crate::error::ApiError;
use crate::routes::json::Json;
use crate::state::AppState;
use crate::store::{EmailRecord, SessionRecord, SignupRequestRecord, TenantRecord, UserRecord};

/// How long a sign-up confirmation link works.
const SIGNUP_LINK_MS: i64 = 24 * 3_600_000;

/// Creates an account: a new organization owned by the user, or membership of an existing one
/// through an invitation token.
#[utoipa::path(
    request_body = SignupRequest,
    responses((status = 201, body = LoginResponse), (status = 202, body = SignupPending, description = "the server sends email: the sign-up is finished from the link sent to the address (answered so whether it has an account or not)"), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody), (status = 429, body = ErrorBody))
)]
#[post("/auth/signup")]
#[tracing::instrument(skip_all)]
pub async fn signup(
    state: web::Data<AppState>,
    http: HttpRequest,
    body: Json<SignupRequest>,
) -> Result<HttpResponse, ApiError> {
    state
        .login_limiter
        .check_signup(http.peer_addr().map(|a| a.ip()))?;
    let req = body.into_inner();
    let email = Email::parse(&req.email)?;
    let pw = Password::parse(&req.password, Some(&email))?;
    let now = state.clock.now_ms();

    let (user, tenant) = if let Some(token) = req.invitation.as_deref().filter(|t| !t.is_empty()) {
        let inv = state
            .store
            .invitation_by_token_hash(&digest(token))
            .await?
            .filter(|i| !i.revoked && i.accepted_at.is_none() && i.expires_at > now)
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
            &email,
            password::hash(pw.into_inner()).await?,
            &tenant.id,
            &inv.role,
            now,
        );
        state.store.accept_invitation(&inv.id, &user, now).await?;
        (user, tenant)
    } else {
        let name = parse_name(
            "tenant_name",
            req.tenant_name.as_deref().unwrap_or_default(),
            64,
        )?;
        if state.settings.confirms_signups() {
            return ask_to_confirm(&state, &email, pw, name, now).await;
        }
        if state.store.user_by_email(email.as_str()).await?.is_some() {
            return Err(ApiError::Conflict(
                "an account with this email already exists".into(),
            ));
        }
        let tenant = TenantRecord {
            id: new_id(),
            name,
            created_at: now,
            trusted: false,
        };
        let user = new_user(
            &email,
            password::hash(pw.into_inner()).await?,
            &tenant.id,
            "owner",
            now,
        );
        state.store.create_tenant_with_owner(&tenant, &user).await?;
        (user, tenant)
    };
    tracing::info!(user = %user.id, tenant = %tenant.id, "signed up");
    audit::record(
        &state,
        Actor::user(&user, &http),
        Some(&tenant.id),
        Action::SignUp,
        &format!("user {}", user.email),
        serde_json::json!({ "role": user.role, "invited": req.invitation.as_deref().is_some_and(|t| !t.is_empty()) }),
    )
    .await;
    start_session(&state, &user, &tenant, now, true).await
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
) -> Result<HttpResponse, ApiError> {
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
    state
        .store
        .queue_email(&EmailRecord {
            id: uuid::Uuid::now_v7().to_string(),
            to_addr: email.as_str().to_owned(),
            event: "auth.sign_up".into(),
            subject,
            body,
            attempts: 0,
            next_at: Some(now),
            sent_at: None,
            last_error: None,
            created_at: now,
        })
        .await?;
    Ok(HttpResponse::Accepted().json(SignupPending {
        status: "confirm_email".into(),
        message: format!(
            "We sent a link to {} to finish signing up; it works for 24 hours.",
            email.as_str()
        ),
    }))
}

/// Finishes a sign-up from the link its email was sent: the organization and its owner are
/// made, and the person is signed in.
#[utoipa::path(
    request_body = SignupConfirmRequest,
    responses((status = 201, body = LoginResponse), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 429, body = ErrorBody))
)]
#[post("/auth/signup/confirm")]
#[tracing::instrument(skip_all)]
pub async fn confirm_signup(
    state: web::Data<AppState>,
    http: HttpRequest,
    body: Json<SignupConfirmRequest>,
) -> Result<HttpResponse, ApiError> {
    state
        .login_limiter
        .check_signup(http.peer_addr().map(|a| a.ip()))?;
    let now = state.clock.now_ms();
    let r = state
        .store
        .take_signup_request(&digest(&body.token), now)
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
    let tenant = TenantRecord {
        id: new_id(),
        name: r.tenant_name,
        created_at: now,
        trusted: false,
    };
    let user = new_user(&email, r.password_hash, &tenant.id, "owner", now);
    state.store.create_tenant_with_owner(&tenant, &user).await?;
    tracing::info!(user = %user.id, tenant = %tenant.id, "signed up (email confirmed)");
    audit::record(
        &state,
        Actor::user(&user, &http),
        Some(&tenant.id),
        Action::SignUp,
        &format!("user {}", user.email),
        serde_json::json!({ "role": user.role, "invited": false, "email_confirmed": true }),
    )
    .await;
    start_session(&state, &user, &tenant, now, true).await
}

fn new_user(email: &Email, hash: String, tenant_id: &str, role: &str, now: i64) -> UserRecord {
    UserRecord {
        id: new_id(),
        email: email.as_str().to_owned(),
        password_hash: hash,
        tenant_id: tenant_id.to_owned(),
        role: role.to_owned(),
        platform_admin: false,
        disabled: false,
        created_at: now,
    }
}

async fn start_session(
    state: &AppState,
    user: &UserRecord,
    tenant: &TenantRecord,
    now: i64,
    created: bool,
) -> Result<HttpResponse, ApiError> {
    let (token, cookies) = open_session(state, user, now).await?;
    let mut res = if created {
        HttpResponse::Created()
    } else {
        HttpResponse::Ok()
    };
    for c in cookies {
        res.cookie(c);
    }
    Ok(res.json(LoginResponse {
        token,
        user: super::me(user, tenant)?,
    }))
}

/// A new session for the user: its token and the cookies that carry it.
pub(super) async fn open_session(
    state: &AppState,
    user: &UserRecord,
    now: i64,
) -> Result<(String, [actix_web::cookie::Cookie<'static>; 2]), ApiError> {
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
    let cookies = state.sessions.cookies(&token, &claims.csrf);
    Ok((token, cookies))
}

#[utoipa::path(
    request_body = LoginRequest,
    responses((status = 200, body = LoginResponse), (status = 401, body = ErrorBody), (status = 429, body = ErrorBody))
)]
#[post("/auth/login")]
#[tracing::instrument(skip_all)]
pub async fn login(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: Json<LoginRequest>,
) -> Result<HttpResponse, ApiError> {
    let email = Email::parse(&body.email)?;
    state
        .login_limiter
        .check(email.as_str(), req.peer_addr().map(|a| a.ip()))?;
    let user = state.store.user_by_email(email.as_str()).await?;
    let stored = user
        .as_ref()
        .map(|u| u.password_hash.clone())
        .unwrap_or_else(|| state.dummy_hash.clone());
    let ok = password::verify(body.password.clone(), stored).await?;
    let refused = |why: &'static str| {
        let tenant = user.as_ref().map(|u| u.tenant_id.clone());
        let actor = match &user {
            Some(u) => Actor::user(u, &req),
            None => Actor::anonymous(Some(email.as_str()), &req),
        };
        let state = state.clone();
        let target = format!("user {}", email.as_str());
        async move {
            audit::record(
                &state,
                actor,
                tenant.as_deref(),
                Action::SignInFailed,
                &target,
                serde_json::json!({ "reason": why }),
            )
            .await;
        }
    };
    let user = match &user {
        Some(u) if ok => u.clone(),
        _ => {
            refused("wrong email or password").await;
            return Err(ApiError::Unauthorized("wrong email or password".into()));
        }
    };
    if user.disabled {
        refused("account disabled").await;
        return Err(ApiError::Unauthorized("this account is disabled".into()));
    }
    // Platform admins and owners keep their password: the way back in when a provider is down
    // or misconfigured (an owner is never locked out of their own organization).
    if !user.platform_admin
        && user.role != "owner"
        && !state.store.password_login(&user.tenant_id).await?
    {
        refused("password sign-in is off for this organization").await;
        return Err(ApiError::Forbidden(
            "your organization signs in with single sign-on: use its button on the sign-in page"
                .into(),
        ));
    }
    let tenant = state
        .store
        .tenant(&user.tenant_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("user {} has no tenant", user.id))?;
    audit::record(
        &state,
        Actor::user(&user, &req),
        Some(&tenant.id),
        Action::SignIn,
        &format!("user {}", user.email),
        serde_json::json!({ "method": "password" }),
    )
    .await;
    start_session(&state, &user, &tenant, state.clock.now_ms(), false).await
}

/// Ends the session (if any) and clears the cookies; always succeeds.
#[utoipa::path(responses((status = 204)))]
#[post("/auth/logout")]
pub async fn logout(
    state: web::Data<AppState>,
    caller: Result<Caller, ApiError>,
) -> Result<HttpResponse, ApiError> {
    if let Ok(caller) = caller {
        if let Some(sid) = caller.session_id() {
            state.store.revoke_session(sid).await?;
        }
    }
    let mut res = HttpResponse::NoContent();
    for c in state.sessions.removal_cookies() {
        res.cookie(c);
    }
    Ok(res.finish())
}

/// Changes the password and ends every other session of the account.
#[utoipa::path(
    request_body = PasswordChangeRequest,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 429, body = ErrorBody))
)]
#[post("/auth/password")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id))]
pub async fn change_password(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    body: Json<PasswordChangeRequest>,
) -> Result<HttpResponse, ApiError> {
    let email = Email::parse(&caller.user.email)?;
    // Whoever holds a session or key must not learn the password by trying it here.
    state
        .login_limiter
        .check(email.as_str(), req.peer_addr().map(|a| a.ip()))?;
    if !password::verify(
        body.current_password.clone(),
        caller.user.password_hash.clone(),
    )
    .await?
    {
        return Err(ApiError::Refused {
            field: "current_password",
            message: "the current password is wrong".into(),
        });
    }
    let new_pw = Password::parse(&body.new_password, Some(&email)).map_err(|e| match e {
        ApiError::Validation { message, .. } => ApiError::invalid("new_password", message),
        other => other,
    })?;
    let hash = password::hash(new_pw.into_inner()).await?;
    state.store.set_password(&caller.user.id, &hash).await?;
    state.accounts_changed();
    state
        .store
        .revoke_user_sessions(&caller.user.id, caller.session_id())
        .await?;
    audit::record(
        &state,
        Actor::of(&caller, &req),
        Some(caller.tenant_id()),
        Action::PasswordChanged,
        &format!("user {}", caller.user.email),
        serde_json::json!({}),
    )
    .await;
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(responses((status = 200, body = Me), (status = 401, body = ErrorBody)))]
#[get("/me")]
pub async fn me(state: web::Data<AppState>, caller: Caller) -> Result<web::Json<Me>, ApiError> {
    let tenant = state
        .store
        .tenant(caller.tenant_id())
        .await?
        .ok_or_else(|| anyhow::anyhow!("tenant missing"))?;
    Ok(web::Json(super::me(&caller.user, &tenant)?))
}
