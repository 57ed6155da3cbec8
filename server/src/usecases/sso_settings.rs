//! Single sign-on's configuration: which providers someone may see, and the settings an
//! organization's owners (or platform administrators, for the platform's provider) keep.

use autodl_common::api::SsoSettingsRequest;

use crate::auth::sso;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{SsoProviderRecord, SsoScope};

/// The providers someone may sign in with: the platform's; an organization's only to its own
/// signed-in people (`tenant`), or for an email of a domain the provider names. Nobody lists
/// every organization's provider (which organizations use the platform, look-alike buttons).
pub async fn visible(
    state: &AppState,
    tenant: Option<&str>,
    email_domain: Option<&str>,
) -> Result<Vec<SsoProviderRecord>, ApiError> {
    let all = state.store.sso_providers().await?;
    Ok(all
        .into_iter()
        .filter(|p| match p.scope.tenant() {
            None => true,
            Some(t) => {
                tenant == Some(t)
                    || email_domain.is_some_and(|d| p.allowed_domains.iter().any(|a| a == d))
            }
        })
        .collect())
}

pub async fn provider(state: &AppState, id: &str) -> Result<SsoProviderRecord, ApiError> {
    state
        .store
        .sso_provider(id)
        .await?
        .ok_or_else(|| ApiError::NotFound("no such sign-in provider".into()))
}

/// A scope's provider, and whether its people may still sign in with a password (always, for
/// the platform's).
pub async fn settings(
    state: &AppState,
    scope: &SsoScope,
) -> Result<(Option<SsoProviderRecord>, bool), ApiError> {
    let provider = state.store.sso_provider_of(scope).await?;
    let password_login = match scope.tenant() {
        Some(t) => state.store.password_login(t).await?,
        None => true,
    };
    Ok((provider, password_login))
}

/// Sets up or changes a scope's provider. The provider is read before it is saved (one that
/// cannot be read would lock people out), and a new issuer forgets the old one's identities
/// (another issuer's subjects are other people). Password sign-in is turned off per
/// organization, never for the platform.
pub async fn put(
    state: &AppState,
    scope: &SsoScope,
    body: &SsoSettingsRequest,
) -> Result<SsoProviderRecord, ApiError> {
    let now = state.clock.now_ms();
    let existing = state.store.sso_provider_of(scope).await?;
    let record = sso::parse_settings(body, scope.clone(), existing.as_ref(), now)?;
    if *scope == SsoScope::Platform && body.password_login.is_some() {
        return Err(ApiError::Refused {
            field: "password_login",
            message: "password sign-in is turned off per organization, not for the platform".into(),
        });
    }
    state
        .sso
        .metadata(&record, now, true)
        .await
        .map_err(|e| ApiError::Refused {
            field: "issuer",
            message: e.to_string(),
        })?;
    let saved = state.store.put_sso_provider(&record).await?;
    if existing.as_ref().is_some_and(|e| e.issuer != saved.issuer) {
        state.store.forget_sso_identities(&saved.id).await?;
    }
    if let (Some(t), Some(allowed)) = (scope.tenant(), body.password_login) {
        state.store.set_password_login(t, allowed).await?;
    }
    Ok(saved)
}

/// Removes a scope's provider (passwords work again); returns what was removed.
pub async fn remove(state: &AppState, scope: &SsoScope) -> Result<SsoProviderRecord, ApiError> {
    let Some(p) = state.store.sso_provider_of(scope).await? else {
        return Err(ApiError::NotFound("no single sign-on is set up".into()));
    };
    state.store.delete_sso_provider(scope).await?;
    Ok(p)
}
