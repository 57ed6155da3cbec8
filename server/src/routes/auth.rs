//! Accounts as HTTP: sign-up, sign-in, sessions' cookies and passwords. The rules are
//! `usecases::accounts`'; the handlers add the rate limits, audit trail and cookies.

use actix_web::{get, post, web, HttpRequest, HttpResponse};
use autodl_common::api::{
    ErrorBody, LoginRequest, LoginResponse, Me, PasswordChangeRequest, SignupConfirmRequest,
    SignupPending, SignupRequest,
};

use crate::audit::{self, Action, Actor};
use crate::auth::Caller;
use crate::domain::{parse_name, Email, Password};
use crate::error::ApiError;
use crate::routes::json::Json;
use crate::state::AppState;
use crate::store::{TenantRecord, UserRecord};
use crate::usecases::accounts::{self, SignUp};
use crate::usecases::organization;

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
    let invitation = req.invitation.as_deref().filter(|t| !t.is_empty());
    let (user, tenant) = if let Some(token) = invitation {
        accounts::join(&state, &email, pw, token).await?
    } else {
        let name = parse_name(
            "tenant_name",
            req.tenant_name.as_deref().unwrap_or_default(),
            64,
        )?;
        match accounts::sign_up(&state, &email, pw, name).await? {
            SignUp::Made(user, tenant) => (user, tenant),
            SignUp::LinkSent => {
                return Ok(HttpResponse::Accepted().json(SignupPending {
                    status: "confirm_email".into(),
                    message: format!(
                        "We sent a link to {} to finish signing up; it works for 24 hours.",
                        email.as_str()
                    ),
                }))
            }
        }
    };
    tracing::info!(user = %user.id, tenant = %tenant.id, "signed up");
    audit::record(
        &state,
        Actor::user(&user, &http),
        Some(&tenant.id),
        Action::SignUp,
        &format!("user {}", user.email),
        serde_json::json!({ "role": user.role, "invited": invitation.is_some() }),
    )
    .await;
    start_session(&state, &user, &tenant, true).await
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
    let (user, tenant) = accounts::confirm_sign_up(&state, &body.token).await?;
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
    start_session(&state, &user, &tenant, true).await
}

async fn start_session(
    state: &AppState,
    user: &UserRecord,
    tenant: &TenantRecord,
    created: bool,
) -> Result<HttpResponse, ApiError> {
    let (token, cookies) = open_session(state, user).await?;
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
) -> Result<(String, [actix_web::cookie::Cookie<'static>; 2]), ApiError> {
    let (token, claims) = accounts::open_session(state, user).await?;
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
    let (user, tenant) = match accounts::sign_in(&state, &email, body.password.clone()).await? {
        Ok(signed_in) => signed_in,
        Err(refused) => {
            let actor = match &refused.user {
                Some(u) => Actor::user(u, &req),
                None => Actor::anonymous(Some(email.as_str()), &req),
            };
            audit::record(
                &state,
                actor,
                refused.user.as_ref().map(|u| u.tenant_id.as_str()),
                Action::SignInFailed,
                &format!("user {}", email.as_str()),
                serde_json::json!({ "reason": refused.reason }),
            )
            .await;
            return Err(refused.error);
        }
    };
    audit::record(
        &state,
        Actor::user(&user, &req),
        Some(&tenant.id),
        Action::SignIn,
        &format!("user {}", user.email),
        serde_json::json!({ "method": "password" }),
    )
    .await;
    start_session(&state, &user, &tenant, false).await
}

/// Ends the session (if any) and clears the cookies; always succeeds.
#[utoipa::path(responses((status = 204)))]
#[post("/auth/logout")]
pub async fn logout(
    state: web::Data<AppState>,
    caller: Result<Caller, ApiError>,
) -> Result<HttpResponse, ApiError> {
    if let Ok(caller) = caller {
        accounts::sign_out(&state, &caller).await?;
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
    accounts::change_password(
        &state,
        &caller,
        body.current_password.clone(),
        &body.new_password,
    )
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
    let tenant = organization::of(&state, &caller).await?;
    Ok(web::Json(super::me(&caller.user, &tenant)?))
}
