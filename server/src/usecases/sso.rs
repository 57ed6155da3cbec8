//! Who a provider's sign-in is here: the account linked to its subject, or a new one it makes.
//!
//! A provider is controlled by whoever configured it (an organization's owner), and it says
//! whatever it likes of its people: an organization's provider signs in only the people it was
//! linked to (each linked themselves, signed in: [`link_account`]) or that it made, never an
//! existing account because it claims the account's email, and never anyone of another
//! organization. New accounts need an email the provider verified. The platform's provider,
//! set up by platform administrators, also links by verified email the accounts no other
//! provider speaks for, of organizations that let their people choose how to sign in.

use autodl_common::api::Role;

use crate::auth::password;
use crate::auth::secrets::{digest, new_id, random_hex};
use crate::auth::sso::{domain_allowed, role_for, Identity, SsoError, Started};
use crate::domain::Email;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{SsoProviderRecord, SsoScope, TenantRecord, UserRecord};

pub struct SignedIn {
    pub user: UserRecord,
    pub tenant: TenantRecord,
}

pub async fn account_for(
    state: &AppState,
    p: &SsoProviderRecord,
    id: &Identity,
    now: i64,
) -> Result<SignedIn, SsoError> {
    let refused = |m: &str| SsoError::Refused(m.to_owned());
    let email = id.email.as_deref().ok_or_else(|| {
        refused("the provider did not say your email address (ask for the email scope)")
    })?;
    let email = Email::parse(email)
        .map_err(|_| SsoError::Refused(format!("{email:?} is not an email address")))?;
    if !domain_allowed(p, email.as_str()) {
        return Err(SsoError::Refused(format!(
            "{} may not sign in here: this provider admits {}",
            email.as_str(),
            p.allowed_domains.join(", ")
        )));
    }
    let role = role_for(p, id);
    let linked = match state.store.sso_identity(&p.id, &id.subject).await? {
        Some(user_id) => state.store.user(&user_id).await?,
        None => None,
    };
    let user = match linked {
        Some(u) => u,
        None => match state.store.user_by_email(email.as_str()).await? {
            Some(u) => {
                if p.scope.tenant().is_some_and(|t| t != u.tenant_id) {
                    return Err(refused(
                        "this email's account belongs to another organization; its provider \
                         cannot sign it in",
                    ));
                }
                if p.scope.tenant().is_some() {
                    return Err(refused(
                        "an account with this email exists and is not linked to this provider: \
                         sign in with your password and link single sign-on on your account page \
                         (an owner can turn password sign-in on again for that)",
                    ));
                }
                if p.scope == SsoScope::Platform
                    && (!state.store.sso_links_of(&u.id).await?.is_empty()
                        || !state.store.password_login(&u.tenant_id).await?)
                {
                    return Err(refused(
                        "this email's account signs in through its organization's provider",
                    ));
                }
                if !id.email_verified {
                    return Err(refused(
                        "an account with this email exists, and the provider has not verified \
                         the email: sign in with your password, or verify the email at the provider",
                    ));
                }
                state
                    .store
                    .link_sso_identity(&p.id, &id.subject, &u.id, now)
                    .await?;
                u
            }
            None if !id.email_verified => {
                return Err(refused(
                    "the provider has not verified your email address, so no account is made",
                ))
            }
            None => create(state, p, id, &email, role, now).await?,
        },
    };
    if user.disabled {
        return Err(refused("this account is disabled"));
    }
    if p.scope == SsoScope::Platform && !state.store.password_login(&user.tenant_id).await? {
        return Err(refused(
            "your organization signs in through its own provider: use its button",
        ));
    }
    let mut user = user;
    if let SsoScope::Tenant(tenant_id) = &p.scope {
        // The provider's claims keep deciding the role, except an owner's.
        if user.role != Role::Owner {
            match role {
                None => {
                    return Err(refused(
                        "the provider gives you no role in this organization (ask its admins)",
                    ))
                }
                Some(r) if r != user.role => {
                    state
                        .store
                        .set_member_role(tenant_id, &user.id, r.as_str())
                        .await?;
                    state.accounts_changed();
                    user.role = r;
                }
                Some(_) => {}
            }
        }
    }
    signed_in(state, user).await
}

async fn create(
    state: &AppState,
    p: &SsoProviderRecord,
    id: &Identity,
    email: &Email,
    role: Option<Role>,
    now: i64,
) -> Result<UserRecord, SsoError> {
    // A password nobody knows: the account signs in through its provider (or a reset).
    let unusable = password::hash(random_hex(32))
        .await
        .map_err(|e| SsoError::Internal(e.to_string()))?;
    let mut user = UserRecord {
        id: new_id(),
        email: email.as_str().to_owned(),
        password_hash: unusable,
        tenant_id: String::new(),
        // Set below, by the provider's scope.
        role: Role::Member,
        platform_admin: false,
        disabled: false,
        created_at: now,
    };
    let tenant = match &p.scope {
        SsoScope::Tenant(t) => {
            user.tenant_id = t.clone();
            user.role = role.ok_or_else(|| {
                SsoError::Refused(
                    "the provider gives you no role in this organization (ask its admins)".into(),
                )
            })?;
            None
        }
        SsoScope::Platform => {
            // Organization names are unique: a name taken first cannot block a sign-in.
            let local = email.as_str().split('@').next().unwrap_or("team");
            let tenant = TenantRecord {
                id: new_id(),
                name: format!(
                    "{}-{}",
                    local.chars().take(48).collect::<String>(),
                    &random_hex(3)
                ),
                created_at: now,
                trusted: false,
                internal: false,
            };
            user.tenant_id = tenant.id.clone();
            user.role = Role::Owner;
            Some(tenant)
        }
    };
    state
        .store
        .create_sso_account(tenant.as_ref(), &user, &p.id, &id.subject)
        .await?;
    Ok(user)
}

/// Links the signed-in account `user_id` to the subject the provider vouched for (the person
/// proved both: their session here and their sign-in there), then signs it in.
pub async fn link_account(
    state: &AppState,
    p: &SsoProviderRecord,
    id: &Identity,
    user_id: &str,
    now: i64,
) -> Result<SignedIn, SsoError> {
    let refused = |m: &str| SsoError::Refused(m.to_owned());
    let user = state
        .store
        .user(user_id)
        .await?
        .filter(|u| !u.disabled)
        .ok_or_else(|| refused("the account to link is gone or disabled"))?;
    if p.scope.tenant().is_some_and(|t| t != user.tenant_id) {
        return Err(refused(
            "this provider belongs to another organization; it cannot sign your account in",
        ));
    }
    match state.store.sso_identity(&p.id, &id.subject).await? {
        Some(other) if other != user.id => {
            return Err(refused(
                "this identity at the provider already signs in another account",
            ))
        }
        Some(_) => {}
        None => {
            state
                .store
                .link_sso_identity(&p.id, &id.subject, &user.id, now)
                .await?
        }
    }
    signed_in(state, user).await
}

async fn signed_in(state: &AppState, user: UserRecord) -> Result<SignedIn, SsoError> {
    let tenant = state
        .store
        .tenant(&user.tenant_id)
        .await?
        .ok_or_else(|| SsoError::Internal(format!("user {} has no organization", user.id)))?;
    Ok(SignedIn { user, tenant })
}

/// Keeps a started sign-in until the provider sends the browser back.
pub async fn begun(state: &AppState, started: &Started, now: i64) -> Result<(), ApiError> {
    state.store.begin_sso_login(&started.login, now).await?;
    Ok(())
}

/// What the provider sent the browser back with, and the secret the browser kept.
pub struct Answer<'a> {
    pub state: Option<&'a str>,
    pub code: Option<&'a str>,
    pub error: Option<&'a str>,
    pub error_description: Option<&'a str>,
    pub browser_secret: Option<&'a str>,
}

/// A finished sign-in: who, where the browser goes on to, and through which provider.
pub struct Finished {
    pub user: UserRecord,
    pub tenant: TenantRecord,
    pub return_to: String,
    pub provider: String,
}

/// Why a callback signed nobody in, whom it concerned, and where to show it.
pub struct Refusal {
    pub error: SsoError,
    pub email: Option<String>,
    pub tenant: Option<String>,
    /// A signed-in person linking their account goes back to where they started.
    pub back: Option<String>,
}

impl From<SsoError> for Refusal {
    fn from(error: SsoError) -> Self {
        Refusal {
            error,
            email: None,
            tenant: None,
            back: None,
        }
    }
}

/// Checks the provider's answer and finishes the sign-in it started: the login it names is
/// taken once (a replayed answer finds nothing), in the browser that started it, and the
/// identity the provider vouches for signs in (or links) an account by the rules above.
pub async fn finish(state: &AppState, a: &Answer<'_>, now: i64) -> Result<Finished, Refusal> {
    let refuse = |m: &str| Refusal::from(SsoError::Refused(m.to_owned()));
    let state_param = a
        .state
        .ok_or_else(|| refuse("the provider's answer has no state"))?;
    let login = state
        .store
        .take_sso_login(&digest(state_param))
        .await
        .map_err(|e| Refusal::from(SsoError::from(e)))?
        .filter(|l| l.expires_at > now)
        .ok_or_else(|| {
            refuse(
                "this sign-in was already used or has expired; start again from the sign-in page",
            )
        })?;
    let browser = a.browser_secret.map(digest).unwrap_or_default();
    if browser != login.browser_hash {
        return Err(refuse(
            "this sign-in was started in another browser; start again from the sign-in page",
        ));
    }
    let p = state
        .store
        .sso_provider(&login.provider_id)
        .await
        .map_err(|e| Refusal::from(SsoError::from(e)))?
        .ok_or_else(|| refuse("this sign-in provider was removed"))?;
    let about = |error: SsoError, email: Option<String>| Refusal {
        error,
        email,
        tenant: p.scope.tenant().map(str::to_owned),
        back: login.link_user.as_ref().map(|_| login.return_to.clone()),
    };
    if let Some(err) = a.error {
        let why = a.error_description.unwrap_or(err);
        return Err(about(
            SsoError::Refused(format!("the provider refused: {why}")),
            None,
        ));
    }
    let code = a
        .code
        .ok_or_else(|| about(SsoError::Refused("the provider sent no code".into()), None))?;
    let identity = state
        .sso
        .finish(&p, &login, code, now)
        .await
        .map_err(|e| about(e, None))?;
    let signed = match &login.link_user {
        Some(user_id) => link_account(state, &p, &identity, user_id, now).await,
        None => account_for(state, &p, &identity, now).await,
    }
    .map_err(|e| about(e, identity.email.clone()))?;
    Ok(Finished {
        user: signed.user,
        tenant: signed.tenant,
        return_to: login.return_to.clone(),
        provider: p.id.clone(),
    })
}
