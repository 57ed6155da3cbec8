//! Single sign-on with OpenID Connect: the authorization code flow with PKCE, `state` and
//! `nonce`, and ID tokens checked against the issuer's published keys (the `openidconnect`
//! crate does the protocol and the signature, audience, issuer, expiry and nonce checks).
//!
//! Providers are configured by organizations' admins, who are not trusted with this server's
//! network: unless the operator allows it, an organization's provider is reached on public
//! addresses only (the issuer and every endpoint its discovery names), as webhooks are.
//! The platform's own provider, set by platform admins, may sit on an internal network.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use openidconnect::core::{
    CoreAuthDisplay, CoreAuthPrompt, CoreAuthenticationFlow, CoreErrorResponseType,
    CoreGenderClaim, CoreJsonWebKey, CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm,
    CoreProviderMetadata, CoreRevocableToken, CoreRevocationErrorResponse,
    CoreTokenIntrospectionResponse, CoreTokenType,
};
use openidconnect::{
    AdditionalClaims, AuthorizationCode, ClaimsVerificationError, ClientId, ClientSecret,
    CsrfToken, EmptyExtraTokenFields, EndpointMaybeSet, EndpointNotSet, EndpointSet, HttpRequest,
    HttpResponse, IdTokenFields, IssuerUrl, Nonce, OAuth2TokenResponse, PkceCodeChallenge,
    PkceCodeVerifier, RedirectUrl, Scope, SignatureVerificationError, StandardErrorResponse,
    StandardTokenResponse, TokenResponse,
};
use serde::{Deserialize, Serialize};

use crate::auth::secrets::{digest, new_id, random_hex};
use crate::domain::parse_name;
use crate::error::ApiError;
use crate::store::{SsoLoginRecord, SsoProviderRecord, SsoScope};

mod settings;
#[cfg(test)]
mod tests;

pub use settings::{domain_allowed, parse_settings, role_for};

/// Where providers send people back, under the server's public address.
pub const CALLBACK_PATH: &str = "/api/v1/auth/sso/callback";
/// The cookie that ties a sign-in to the browser that started it.
pub const BROWSER_COOKIE: &str = "autodl_sso";
/// How long a person has to sign in at the provider.
const LOGIN_TTL_MS: i64 = 10 * 60 * 1000;
/// Discovery documents (and with them the keys) are read again after this long.
const METADATA_TTL_MS: i64 = 60 * 60 * 1000;

/// Every claim, as sent: the role claim may be any of them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Claims {
    #[serde(flatten)]
    all: serde_json::Map<String, serde_json::Value>,
}

impl AdditionalClaims for Claims {}

type IdFields = IdTokenFields<
    Claims,
    EmptyExtraTokenFields,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
>;
type Tokens = StandardTokenResponse<IdFields, CoreTokenType>;
type OidcClient = openidconnect::Client<
    Claims,
    CoreAuthDisplay,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJsonWebKey,
    CoreAuthPrompt,
    StandardErrorResponse<CoreErrorResponseType>,
    Tokens,
    CoreTokenIntrospectionResponse,
    CoreRevocableToken,
    CoreRevocationErrorResponse,
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// Why a sign-in through a provider did not happen, in words for the person.
#[derive(Debug, thiserror::Error)]
pub enum SsoError {
    /// The provider could not be read or answered wrongly.
    #[error("the identity provider could not be used: {0}")]
    Provider(String),
    /// The provider's answer or the person was refused.
    #[error("{0}")]
    Refused(String),
    /// Our side failed (the database); nothing the person did.
    #[error("the sign-in could not be finished here; try again ({0})")]
    Internal(String),
}

impl From<crate::store::StoreError> for SsoError {
    fn from(e: crate::store::StoreError) -> Self {
        // The details go to the log, not into the sign-in page's address.
        tracing::error!(error = %e, "single sign-on could not use the database");
        SsoError::Internal("the database".into())
    }
}

/// Who the provider vouched for.
#[derive(Debug, Clone)]
pub struct Identity {
    pub subject: String,
    pub email: Option<String>,
    pub email_verified: bool,
    /// The role claim's values (a string or a list of strings).
    pub role_values: Vec<String>,
}

/// A sign-in started: where to send the browser, what to keep, and the browser's secret.
pub struct Started {
    pub authorize_url: url::Url,
    pub login: SsoLoginRecord,
    pub browser_secret: String,
}

/// The providers' discovery documents (with their keys), and the HTTP clients to reach them.
pub struct Oidc {
    /// Reaches any address: the platform's provider (or every provider, if the operator allows).
    open: reqwest::Client,
    /// Reaches public addresses only.
    public: reqwest::Client,
    allow_internal: bool,
    redirect_uri: RedirectUrl,
    /// By issuer; bounded, as admins may try many issuers.
    metadata: moka::sync::Cache<String, (Arc<CoreProviderMetadata>, i64)>,
}

impl Oidc {
    pub fn new(public_url: &str, allow_internal: bool) -> anyhow::Result<Oidc> {
        let build = |public_only: bool| {
            let b = reqwest::Client::builder()
                // Redirects would let a provider send us anywhere (the crate's own advice).
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(10));
            if public_only {
                b.dns_resolver(Arc::new(PublicOnly))
            } else {
                b
            }
            .build()
        };
        Ok(Oidc {
            open: build(false)?,
            public: build(true)?,
            allow_internal,
            redirect_uri: RedirectUrl::new(format!(
                "{}{CALLBACK_PATH}",
                public_url.trim_end_matches('/')
            ))?,
            metadata: moka::sync::Cache::new(1_000),
        })
    }

    pub fn redirect_uri(&self) -> &str {
        self.redirect_uri.as_str()
    }

    fn trusted(&self, p: &SsoProviderRecord) -> bool {
        self.allow_internal || p.scope == SsoScope::Platform
    }

    /// The HTTP client for `p`'s provider, which checks every address it is asked to call
    /// (discovery, keys, token, userinfo) before calling it, and reads at most 1 MiB back.
    fn http<'a>(
        &'a self,
        p: &SsoProviderRecord,
    ) -> impl Fn(HttpRequest) -> BoxFuture<'a, Result<HttpResponse, FetchError>> + 'a {
        let trusted = self.trusted(p);
        let client = if trusted { &self.open } else { &self.public };
        move |req| Box::pin(fetch(client, trusted, req))
    }

    /// The provider's discovery document: kept for an hour, read again when `fresh` (a token
    /// signed by a key we do not know: each such token came from the provider's token
    /// endpoint for a real code, so nobody can make us read it at will).
    pub async fn metadata(
        &self,
        p: &SsoProviderRecord,
        now: i64,
        fresh: bool,
    ) -> Result<Arc<CoreProviderMetadata>, SsoError> {
        if let Some((m, at)) = self.cached(&p.issuer) {
            if !fresh && now - at < METADATA_TTL_MS {
                return Ok(m);
            }
        }
        check_endpoint(&p.issuer, self.trusted(p))?;
        let issuer =
            IssuerUrl::new(p.issuer.clone()).map_err(|e| SsoError::Provider(e.to_string()))?;
        let m = CoreProviderMetadata::discover_async(issuer, &self.http(p))
            .await
            .map_err(|e| {
                SsoError::Provider(format!(
                    "could not read {}/.well-known/openid-configuration: {}",
                    p.issuer.trim_end_matches('/'),
                    error_chain(&e)
                ))
            })?;
        for u in [
            Some(m.authorization_endpoint().as_str()),
            m.token_endpoint().map(|u| u.as_str()),
            Some(m.jwks_uri().as_str()),
            m.userinfo_endpoint().map(|u| u.as_str()),
        ]
        .into_iter()
        .flatten()
        {
            check_endpoint(u, self.trusted(p))?;
        }
        let m = Arc::new(m);
        self.metadata.insert(p.issuer.clone(), (m.clone(), now));
        Ok(m)
    }

    fn cached(&self, issuer: &str) -> Option<(Arc<CoreProviderMetadata>, i64)> {
        self.metadata.get(issuer)
    }

    fn client(&self, p: &SsoProviderRecord, m: &CoreProviderMetadata) -> OidcClient {
        OidcClient::from_provider_metadata(
            m.clone(),
            ClientId::new(p.client_id.clone()),
            Some(ClientSecret::new(p.client_secret.clone())),
        )
        .set_redirect_uri(self.redirect_uri.clone())
    }

    /// Starts a sign-in: a fresh state, nonce and PKCE verifier, kept until the provider
    /// sends the person back.
    pub async fn start(
        &self,
        p: &SsoProviderRecord,
        return_to: &str,
        link_user: Option<&str>,
        now: i64,
    ) -> Result<Started, SsoError> {
        let m = self.metadata(p, now, false).await?;
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let client = self.client(p, &m);
        let mut req = client
            .authorize_url(
                CoreAuthenticationFlow::AuthorizationCode,
                CsrfToken::new_random,
                Nonce::new_random,
            )
            .add_scope(Scope::new("email".into()))
            .add_scope(Scope::new("profile".into()))
            .set_pkce_challenge(challenge);
        for s in &p.scopes {
            req = req.add_scope(Scope::new(s.clone()));
        }
        let (authorize_url, state, nonce) = req.url();
        let browser_secret = random_hex(32);
        Ok(Started {
            authorize_url,
            login: SsoLoginRecord {
                state_hash: digest(state.secret()),
                provider_id: p.id.clone(),
                nonce: nonce.secret().clone(),
                pkce_verifier: verifier.secret().clone(),
                browser_hash: digest(&browser_secret),
                return_to: return_to.to_owned(),
                link_user: link_user.map(str::to_owned),
                expires_at: now + LOGIN_TTL_MS,
            },
            browser_secret,
        })
    }

    /// Finishes a sign-in: trades the code (with the PKCE verifier) for tokens, checks the ID
    /// token, and reads the person's claims (from the userinfo endpoint when the ID token
    /// lacks the email).
    pub async fn finish(
        &self,
        p: &SsoProviderRecord,
        login: &SsoLoginRecord,
        code: &str,
        now: i64,
    ) -> Result<Identity, SsoError> {
        let m = self.metadata(p, now, false).await?;
        let tokens = self
            .client(p, &m)
            .exchange_code(AuthorizationCode::new(code.to_owned()))
            .map_err(|e| SsoError::Provider(e.to_string()))?
            .set_pkce_verifier(PkceCodeVerifier::new(login.pkce_verifier.clone()))
            .request_async(&self.http(p))
            .await
            .map_err(|e| {
                SsoError::Provider(format!("the code was refused: {}", error_chain(&e)))
            })?;
        let id_token = tokens
            .id_token()
            .ok_or_else(|| SsoError::Refused("the provider sent no ID token".into()))?;
        let nonce = Nonce::new(login.nonce.clone());
        let verify = |m: &CoreProviderMetadata| {
            let client = self.client(p, m);
            let verifier = client.id_token_verifier().set_time_fn(move || {
                chrono::DateTime::from_timestamp_millis(now).unwrap_or_default()
            });
            id_token.claims(&verifier, &nonce).cloned()
        };
        let claims = match verify(&m) {
            // The provider may have rotated its keys since we read them.
            Err(ClaimsVerificationError::SignatureVerification(
                SignatureVerificationError::NoMatchingKey,
            )) => verify(&*self.metadata(p, now, true).await?),
            other => other,
        }
        .map_err(|e| SsoError::Refused(format!("the ID token was refused: {}", describe(&e))))?;
        let subject = claims.subject().to_string();
        let mut all = claims.additional_claims().all.clone();
        let mut email = claims.email().map(|e| e.to_string());
        let mut verified = claims.email_verified();
        let wants_userinfo =
            email.is_none() || p.role_claim.as_ref().is_some_and(|c| !all.contains_key(c));
        let token_ok = tokens
            .access_token()
            .secret()
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b));
        if wants_userinfo && m.userinfo_endpoint().is_some() {
            if !token_ok {
                return Err(SsoError::Refused(
                    "the provider's access token is not a token (characters outside ASCII)".into(),
                ));
            }
            let info: openidconnect::UserInfoClaims<Claims, CoreGenderClaim> = self
                .client(p, &m)
                .user_info(
                    tokens.access_token().clone(),
                    Some(claims.subject().clone()),
                )
                .map_err(|e| SsoError::Provider(e.to_string()))?
                .request_async(&self.http(p))
                .await
                .map_err(|e| {
                    SsoError::Provider(format!("the userinfo answer: {}", error_chain(&e)))
                })?;
            if email.is_none() {
                email = info.email().map(|e| e.to_string());
                verified = info.email_verified();
            }
            for (k, v) in &info.additional_claims().all {
                all.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        let role_values = p
            .role_claim
            .as_ref()
            .and_then(|c| all.get(c))
            .map(|v| match v {
                serde_json::Value::String(s) => vec![s.clone()],
                serde_json::Value::Array(a) => a
                    .iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect(),
                _ => Vec::new(),
            })
            .unwrap_or_default();
        Ok(Identity {
            subject,
            email,
            email_verified: verified == Some(true),
            role_values,
        })
    }
}

/// The most of a provider's answer that is read.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Why a call to a provider failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FetchError(String);

/// One call to a provider: its address judged first (the addresses come from the provider's
/// own discovery document, which its admin writes), no redirect followed, the answer capped.
async fn fetch(
    client: &reqwest::Client,
    trusted: bool,
    req: HttpRequest,
) -> Result<HttpResponse, FetchError> {
    check_endpoint(&req.uri().to_string(), trusted).map_err(|e| FetchError(e.to_string()))?;
    let req = reqwest::Request::try_from(req).map_err(|e| FetchError(e.to_string()))?;
    let mut res = client
        .execute(req)
        .await
        .map_err(|e| FetchError(error_chain(&e)))?;
    let mut out = openidconnect::http::Response::builder().status(res.status());
    for (k, v) in res.headers() {
        out = out.header(k, v);
    }
    let mut body = Vec::new();
    while let Some(chunk) = res.chunk().await.map_err(|e| FetchError(error_chain(&e)))? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(FetchError("the answer is larger than 1 MiB".into()));
        }
        body.extend_from_slice(&chunk);
    }
    out.body(body).map_err(|e| FetchError(e.to_string()))
}

/// What a person may read of a refused token (the crate's words, first letter down).
fn describe(e: &ClaimsVerificationError) -> String {
    match e {
        ClaimsVerificationError::Expired(_) => "it has expired".into(),
        ClaimsVerificationError::InvalidAudience(_) => {
            "it was issued to another application (wrong audience)".into()
        }
        ClaimsVerificationError::InvalidIssuer(_) => "it was issued by another issuer".into(),
        ClaimsVerificationError::InvalidNonce(_) => {
            "its nonce is not this sign-in's (a replayed token)".into()
        }
        ClaimsVerificationError::SignatureVerification(s) => format!("bad signature ({s})"),
        other => other.to_string(),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A provider URL this server may call: https (plain http only for a trusted provider on
/// this machine), and for untrusted providers no internal address written as a literal
/// (named hosts are judged by the resolver, address by address).
fn check_endpoint(u: &str, trusted: bool) -> Result<(), SsoError> {
    let url = url::Url::parse(u).map_err(|e| SsoError::Provider(format!("{u:?}: {e}")))?;
    let literal = match url.host() {
        Some(url::Host::Ipv4(a)) => Some(IpAddr::V4(a)),
        Some(url::Host::Ipv6(a)) => Some(IpAddr::V6(a)),
        Some(url::Host::Domain(_)) => None,
        None => return Err(SsoError::Provider(format!("{u:?} has no host"))),
    };
    let loopback = literal.is_some_and(|a| a.is_loopback()) || url.host_str() == Some("localhost");
    match url.scheme() {
        "https" => {}
        "http" if loopback && trusted => {}
        _ => {
            return Err(SsoError::Provider(format!(
                "{u} is not https: a provider is reached over TLS"
            )))
        }
    }
    if !trusted && literal.is_some_and(crate::domain::is_internal) {
        return Err(SsoError::Provider(format!(
            "{u} is an internal address; an organization's provider is reached on public ones"
        )));
    }
    Ok(())
}

/// Resolves names to their public addresses only: an organization's provider cannot point
/// this server at its own network, whatever its DNS says.
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if addrs.is_empty() || addrs.iter().any(|a| crate::domain::is_internal(a.ip())) {
                return Err(format!("{host} is (or also is) an internal address").into());
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The local path to show after signing in: only a path of this site (no open redirect).
pub fn return_path(raw: Option<&str>) -> String {
    match raw {
        Some(p)
            if p.starts_with('/')
                && !p.starts_with("//")
                && !p.starts_with("/\\")
                && !p.chars().any(|c| c.is_control() || c == '\\')
                && p.len() <= 512 =>
        {
            p.to_owned()
        }
        _ => "/".to_owned(),
    }
}
