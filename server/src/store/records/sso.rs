//! Single sign-on providers and sign-ins under way.

/// An organization's or the platform's OpenID provider, as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct SsoProviderRecord {
    pub id: String,
    pub scope: SsoScope,
    pub label: String,
    pub issuer: String,
    pub client_id: String,
    pub client_secret: String,
    /// Lowercase email domains whose people may sign in; empty: any.
    pub allowed_domains: Vec<String>,
    /// Scopes asked for besides `openid email profile`.
    pub scopes: Vec<String>,
    pub role_claim: Option<String>,
    /// Claim value → role.
    pub role_map: std::collections::BTreeMap<String, String>,
    /// The role when no value maps; None refuses such people.
    pub default_role: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Whose provider it is: one organization's, or the whole platform's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SsoScope {
    Platform,
    Tenant(String),
}

impl SsoScope {
    const PLATFORM: &'static str = "platform";

    pub fn key(&self) -> &str {
        match self {
            SsoScope::Platform => Self::PLATFORM,
            SsoScope::Tenant(id) => id,
        }
    }

    pub fn from_key(key: &str) -> SsoScope {
        if key == Self::PLATFORM {
            SsoScope::Platform
        } else {
            SsoScope::Tenant(key.to_owned())
        }
    }

    pub fn tenant(&self) -> Option<&str> {
        match self {
            SsoScope::Platform => None,
            SsoScope::Tenant(id) => Some(id),
        }
    }
}

/// A sign-in started at a provider and not yet finished.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SsoLoginRecord {
    pub state_hash: String,
    pub provider_id: String,
    pub nonce: String,
    pub pkce_verifier: String,
    pub browser_hash: String,
    pub return_to: String,
    /// The signed-in account to link, when the sign-in was started to link one.
    pub link_user: Option<String>,
    pub expires_at: i64,
}
