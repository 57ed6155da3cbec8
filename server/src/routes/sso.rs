//! Single sign-on: the sign-in page's buttons, the round trip through the provider, and the
//! settings organizations' admins and platform admins keep.

use actix_web::cookie::{time::Duration as CookieDuration, Cookie, SameSite};
use actix_web::http::header;
use actix_web::{delete, get, put, web, HttpRequest, HttpResponse};
use autodl_common::api::{ErrorBody, SsoOption, SsoProvider, SsoSettings, SsoSettingsRequest};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::audit::{self, Action, Actor};
use crate::auth::sso::{self, BROWSER_COOKIE};
use crate::auth::Caller;
use crate::domain::rfc3339;
use crate::error::ApiError;
use crate::routes::json::Json;
use crate::state::AppState;
use crate::store::{SsoProviderRecord, SsoScope};
use crate::usecases::{sso as round_trip, sso_settings};

fn to_api(state: &AppState, p: &SsoProviderRecord) -> SsoProvider {
    SsoProvider {
        id: p.id.clone(),
        label: p.label.clone(),
        issuer: p.issuer.clone(),
        client_id: p.client_id.clone(),
        allowed_domains: p.allowed_domains.clone(),
        scopes: p.scopes.clone(),
        role_claim: p.role_claim.clone(),
        role_map: p.role_map.clone(),
        default_role: p.default_role.clone(),
        redirect_uri: state.sso.redirect_uri().to_owned(),
        updated_at: rfc3339(p.updated_at),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProvidersQuery {
    /// The email someone is about to sign in with: organizations' providers that admit its
    /// domain are listed too.
    email: Option<String>,
}

/// The providers someone may sign in with: the platform's; an organization's only to its own
/// signed-in people, or for an email of a domain the provider names. Nobody lists every
/// organization's provider (which organizations use the platform, look-alike buttons).
#[utoipa::path(params(ProvidersQuery), responses((status = 200, body = [SsoOption])))]
#[get("/auth/sso/providers")]
pub async fn providers(
    state: web::Data<AppState>,
    caller: Option<Caller>,
    q: web::Query<ProvidersQuery>,
) -> Result<web::Json<Vec<SsoOption>>, ApiError> {
    let domain = q
        .email
        .as_deref()
        .and_then(|e| e.trim().rsplit_once('@'))
        .map(|(_, d)| d.trim_end_matches('.').to_ascii_lowercase())
        .filter(|d| !d.is_empty());
    let visible = sso_settings::visible(
        &state,
        caller.as_ref().map(|c| c.tenant_id()),
        domain.as_deref(),
    )
    .await?;
    Ok(web::Json(
        visible
            .into_iter()
            .map(|p| SsoOption {
                id: p.id,
                label: p.label,
            })
            .collect(),
    ))
}

#[derive(Debug, Deserialize)]
pub struct StartQuery {
    return_to: Option<String>,
    /// Link the signed-in account to the provider instead of signing someone in.
    #[serde(default)]
    link: bool,
}

/// Sends the browser to the provider to sign in; it comes back to the callback.
#[utoipa::path(
    params(("id" = String, Path), ("return_to" = Option<String>, Query, description = "a path of this site to show afterwards"),
        ("link" = Option<bool>, Query, description = "link the signed-in account to the provider")),
    responses((status = 303, description = "to the provider; or to the sign-in page with `sso_error` when it cannot be reached"), (status = 404, body = ErrorBody))
)]
#[get("/auth/sso/{id}/start")]
#[tracing::instrument(skip_all)]
pub async fn start(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Result<Caller, ApiError>,
    id: web::Path<String>,
    query: web::Query<StartQuery>,
) -> Result<HttpResponse, ApiError> {
    // Only from this site's own pages (or a typed address): another site sending a browser
    // here would sign it in to an account of the other site's choosing (login CSRF).
    let fetch_site = req
        .headers()
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok());
    if fetch_site.is_some_and(|s| !matches!(s, "same-origin" | "none")) {
        return Ok(to_login("start single sign-on from this site's sign-in page").finish());
    }
    let link_user = match (query.link, &caller) {
        (false, _) => None,
        (true, Ok(c)) => Some(c.user.id.clone()),
        (true, Err(_)) => return Ok(to_login("sign in first, then link your account").finish()),
    };
    let p = sso_settings::provider(&state, &id).await?;
    let now = state.clock.now_ms();
    let started = match state
        .sso
        .start(
            &p,
            &sso::return_path(query.return_to.as_deref()),
            link_user.as_deref(),
            now,
        )
        .await
    {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(provider = %p.id, error = %e, "single sign-on could not start");
            return Ok(to_login(&e.to_string()).finish());
        }
    };
    round_trip::begun(&state, &started, now).await?;
    let cookie = Cookie::build(BROWSER_COOKIE, started.browser_secret)
        .path("/api/v1/auth/sso")
        .http_only(true)
        // Lax: the provider's redirect back is a top-level navigation from its site.
        .same_site(SameSite::Lax)
        .secure(state.sessions.secure)
        .max_age(CookieDuration::minutes(10))
        .finish();
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, started.authorize_url.to_string()))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .cookie(cookie)
        .finish())
}

#[derive(Debug, Deserialize)]
pub struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

/// The provider sends the browser back here: the sign-in is checked and finished, and the
/// browser goes on to where it started (or to the sign-in page, with the reason).
#[utoipa::path(
    params(("code" = Option<String>, Query), ("state" = Option<String>, Query), ("error" = Option<String>, Query), ("error_description" = Option<String>, Query)),
    responses((status = 303, description = "signed in, to the page it started on; or to the sign-in page with `sso_error`"))
)]
#[get("/auth/sso/callback")]
#[tracing::instrument(skip_all)]
pub async fn callback(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<CallbackQuery>,
) -> Result<HttpResponse, ApiError> {
    let now = state.clock.now_ms();
    let secret = req.cookie(BROWSER_COOKIE);
    let answer = round_trip::Answer {
        state: query.state.as_deref(),
        code: query.code.as_deref(),
        error: query.error.as_deref(),
        error_description: query.error_description.as_deref(),
        browser_secret: secret.as_ref().map(|c| c.value()),
    };
    let outcome = round_trip::finish(&state, &answer, now).await;
    let mut forget = Cookie::build(BROWSER_COOKIE, "")
        .path("/api/v1/auth/sso")
        .finish();
    forget.make_removal();
    match outcome {
        Ok(round_trip::Finished {
            user,
            tenant,
            return_to,
            provider,
        }) => {
            audit::record(
                &state,
                Actor::user(&user, &req),
                Some(&tenant.id),
                Action::SignIn,
                &format!("user {}", user.email),
                serde_json::json!({ "method": "sso", "provider": provider }),
            )
            .await;
            let (_, cookies) = super::auth::open_session(&state, &user).await?;
            let mut res = HttpResponse::SeeOther();
            res.insert_header((header::LOCATION, return_to))
                .insert_header((header::CACHE_CONTROL, "no-store"))
                .cookie(forget);
            for c in cookies {
                res.cookie(c);
            }
            Ok(res.finish())
        }
        Err(r) => {
            let (e, who) = (r.error, r.email);
            tracing::info!(error = %e, "single sign-on refused");
            audit::record(
                &state,
                Actor::anonymous(who.as_deref(), &req),
                r.tenant.as_deref(),
                Action::SignInFailed,
                &format!("user {}", who.as_deref().unwrap_or("unknown")),
                serde_json::json!({ "method": "sso", "reason": e.to_string() }),
            )
            .await;
            let mut res = match r.back {
                Some(path) => back_with(&path, &e.to_string()),
                None => to_login(&e.to_string()),
            };
            Ok(res.cookie(forget).finish())
        }
    }
}

/// Back to the sign-in page, which shows why.
fn to_login(why: &str) -> actix_web::HttpResponseBuilder {
    back_with("/login", why)
}

/// Back to `path` (a local path) with `sso_error`, which the page shows.
fn back_with(path: &str, why: &str) -> actix_web::HttpResponseBuilder {
    let query: String = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("sso_error", why)
        .finish();
    let sep = if path.contains('?') { '&' } else { '?' };
    let mut res = HttpResponse::SeeOther();
    res.insert_header((header::LOCATION, format!("{path}{sep}{query}")))
        .insert_header((header::CACHE_CONTROL, "no-store"));
    res
}

/// The organization's single sign-on (owners and admins).
#[utoipa::path(responses((status = 200, body = SsoSettings), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
#[get("/tenant/sso")]
pub async fn tenant_settings(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<SsoSettings>, ApiError> {
    caller.require_manager()?;
    settings(&state, &SsoScope::Tenant(caller.tenant_id().to_owned())).await
}

/// Sets up or changes the organization's provider, and whether passwords still work.
#[utoipa::path(request_body = SsoSettingsRequest, responses((status = 200, body = SsoSettings), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody, description = "not an owner; or the issuer could not be read (field `issuer`)")))]
#[put("/tenant/sso")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id))]
pub async fn put_tenant_settings(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    body: Json<SsoSettingsRequest>,
) -> Result<web::Json<SsoSettings>, ApiError> {
    caller.require_owner()?;
    let scope = SsoScope::Tenant(caller.tenant_id().to_owned());
    put_settings(&state, &req, &caller, scope, body.into_inner()).await
}

/// Removes the organization's provider; passwords work again.
#[utoipa::path(responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
#[delete("/tenant/sso")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id))]
pub async fn delete_tenant_settings(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    caller.require_owner()?;
    let scope = SsoScope::Tenant(caller.tenant_id().to_owned());
    delete_settings(&state, &req, &caller, scope).await
}

/// The platform's provider, open to everyone (platform admins).
#[utoipa::path(responses((status = 200, body = SsoSettings), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
#[get("/admin/sso")]
pub async fn platform_settings(
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<web::Json<SsoSettings>, ApiError> {
    caller.require_platform_admin()?;
    settings(&state, &SsoScope::Platform).await
}

#[utoipa::path(request_body = SsoSettingsRequest, responses((status = 200, body = SsoSettings), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
#[put("/admin/sso")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id))]
pub async fn put_platform_settings(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    body: Json<SsoSettingsRequest>,
) -> Result<web::Json<SsoSettings>, ApiError> {
    caller.require_platform_admin()?;
    put_settings(&state, &req, &caller, SsoScope::Platform, body.into_inner()).await
}

#[utoipa::path(responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
#[delete("/admin/sso")]
#[tracing::instrument(skip_all, fields(user = %caller.user.id))]
pub async fn delete_platform_settings(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    caller.require_platform_admin()?;
    delete_settings(&state, &req, &caller, SsoScope::Platform).await
}

async fn settings(state: &AppState, scope: &SsoScope) -> Result<web::Json<SsoSettings>, ApiError> {
    let (provider, password_login) = sso_settings::settings(state, scope).await?;
    Ok(web::Json(SsoSettings {
        provider: provider.as_ref().map(|p| to_api(state, p)),
        password_login,
        redirect_uri: state.sso.redirect_uri().to_owned(),
    }))
}

async fn put_settings(
    state: &AppState,
    req: &HttpRequest,
    caller: &Caller,
    scope: SsoScope,
    body: SsoSettingsRequest,
) -> Result<web::Json<SsoSettings>, ApiError> {
    let saved = sso_settings::put(state, &scope, &body).await?;
    audit::record(
        state,
        Actor::of(caller, req),
        scope.tenant(),
        Action::SsoConfigured,
        &format!("sso provider {}", saved.id),
        serde_json::json!({
            "issuer": saved.issuer,
            "client_id": saved.client_id,
            "allowed_domains": saved.allowed_domains,
            "role_claim": saved.role_claim,
            "role_map": saved.role_map,
            "default_role": saved.default_role,
            "secret_changed": body.client_secret.as_deref().is_some_and(|s| !s.is_empty()),
            "password_login": body.password_login,
        }),
    )
    .await;
    settings(state, &scope).await
}

async fn delete_settings(
    state: &AppState,
    req: &HttpRequest,
    caller: &Caller,
    scope: SsoScope,
) -> Result<HttpResponse, ApiError> {
    let p = sso_settings::remove(state, &scope).await?;
    audit::record(
        state,
        Actor::of(caller, req),
        scope.tenant(),
        Action::SsoRemoved,
        &format!("sso provider {}", p.id),
        serde_json::json!({ "issuer": p.issuer }),
    )
    .await;
    Ok(HttpResponse::NoContent().finish())
}
