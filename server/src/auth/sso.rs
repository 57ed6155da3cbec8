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

/// Where providers send people back, under the server's public address.
pub const CALLBACK_PATH: &str = "/api/v1/auth/sso/callback";
/// The cookie that ties a sign-in to the browser that started it.
pub const BROWSER_COOKIE: &str = "autodl_sso";
/// How long a person has to sign in at the provider.
const LOGIN_TTL_MS: i64 = 10 * 60 * 1000;
/// Discovery documents (and with them the keys) are read again after this long.
const METADATA_TTL_MS: i64 = 60 * 60 * 1000;
/// Roles a provider's claims may give: owners are made by people, not by a claim.
const MAPPABLE_ROLES: [&str; 2] = ["admin", "member"];

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

/// A configuration from an admin, checked field by field into what the store keeps.
pub fn parse_settings(
    req: &autodl_common::api::SsoSettingsRequest,
    scope: SsoScope,
    existing: Option<&SsoProviderRecord>,
    now: i64,
) -> Result<SsoProviderRecord, ApiError> {
    let label = parse_name("label", &req.label, 64)?;
    let issuer = req.issuer.trim().to_owned();
    let url = url::Url::parse(&issuer)
        .map_err(|e| ApiError::invalid("issuer", format!("{issuer:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "https" | "http") || url.host().is_none() {
        return Err(ApiError::invalid(
            "issuer",
            "the issuer is an https:// URL (http:// only on this machine)",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ApiError::invalid(
            "issuer",
            "an issuer URL has no query or fragment",
        ));
    }
    let text = |field: &'static str, s: &str, max: usize| -> Result<String, ApiError> {
        let s = s.trim();
        if s.is_empty() || s.chars().count() > max || s.chars().any(char::is_control) {
            return Err(ApiError::invalid(
                field,
                format!("{field} is 1 to {max} printable characters"),
            ));
        }
        Ok(s.to_owned())
    };
    let client_id = text("client_id", &req.client_id, 255)?;
    // The kept secret only ever goes to the issuer and client it was given for.
    let moved = existing.is_some_and(|p| p.issuer != issuer || p.client_id != client_id);
    let client_secret = match (&req.client_secret, existing) {
        (Some(s), _) if !s.is_empty() => text("client_secret", s, 1024)?,
        (_, Some(p)) if !moved => p.client_secret.clone(),
        (_, Some(_)) => {
            return Err(ApiError::Refused {
                field: "client_secret",
                message: "a new issuer or client id needs its client secret given again".into(),
            })
        }
        // Required the first time only: that depends on what is stored, not on the body.
        _ => {
            return Err(ApiError::Refused {
                field: "client_secret",
                message: "the client secret the provider gave this platform is required".into(),
            })
        }
    };
    if req.allowed_domains.len() > 50 {
        return Err(ApiError::invalid("allowed_domains", "at most 50 domains"));
    }
    let mut allowed_domains = Vec::new();
    for d in &req.allowed_domains {
        let d = d.trim().trim_start_matches('@').to_lowercase();
        let ok = !d.is_empty()
            && d.len() <= 253
            && d.contains('.')
            && d.split('.').all(|l| {
                !l.is_empty()
                    && !l.starts_with('-')
                    && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            });
        if !ok {
            return Err(ApiError::invalid(
                "allowed_domains",
                format!("{d:?} is not an email domain (e.g. example.com)"),
            ));
        }
        if !allowed_domains.contains(&d) {
            allowed_domains.push(d);
        }
    }
    if req.scopes.len() > 20 {
        return Err(ApiError::invalid("scopes", "at most 20 scopes"));
    }
    let mut scopes = Vec::new();
    for s in &req.scopes {
        let s = s.trim();
        if s.is_empty()
            || s.len() > 64
            || !s
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.:/".contains(c))
        {
            return Err(ApiError::invalid(
                "scopes",
                format!("{s:?} is not a scope name"),
            ));
        }
        if !matches!(s, "openid" | "email" | "profile") && !scopes.iter().any(|x| x == s) {
            scopes.push(s.to_owned());
        }
    }
    let role = |field: &'static str, r: &str| -> Result<String, ApiError> {
        if MAPPABLE_ROLES.contains(&r) {
            Ok(r.to_owned())
        } else {
            Err(ApiError::invalid(
                field,
                format!("{r:?} is not a role a provider may give: admin or member"),
            ))
        }
    };
    let role_claim = match req.role_claim.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(c) => Some(text("role_claim", c, 64)?),
    };
    if req.role_map.len() > 100 {
        return Err(ApiError::invalid("role_map", "at most 100 values"));
    }
    let mut role_map = BTreeMap::new();
    for (value, r) in &req.role_map {
        role_map.insert(text("role_map", value, 255)?, role("role_map", r)?);
    }
    if !role_map.is_empty() && role_claim.is_none() {
        return Err(ApiError::invalid(
            "role_claim",
            "name the claim whose values the role map reads (e.g. groups)",
        ));
    }
    let default_role = match req.default_role.as_deref() {
        None | Some("") => None,
        Some(r) => Some(role("default_role", r)?),
    };
    if scope == SsoScope::Platform && (role_claim.is_some() || default_role.is_some()) {
        return Err(ApiError::Refused {
            field: "role_claim",
            message: "the platform's provider gives each new person an organization of their \
                      own; roles are set by organizations' providers"
                .into(),
        });
    }
    Ok(SsoProviderRecord {
        id: existing.map_or_else(new_id, |p| p.id.clone()),
        scope,
        label,
        issuer,
        client_id,
        client_secret,
        allowed_domains,
        scopes,
        role_claim,
        role_map,
        default_role,
        created_at: existing.map_or(now, |p| p.created_at),
        updated_at: now,
    })
}

/// The role a person gets from the provider's claims: the strongest mapped value, else the
/// default; None when the provider gives them no role here.
pub fn role_for(p: &SsoProviderRecord, id: &Identity) -> Option<String> {
    let mapped: Vec<&String> = id
        .role_values
        .iter()
        .filter_map(|v| p.role_map.get(v))
        .collect();
    MAPPABLE_ROLES
        .iter()
        .find(|r| mapped.iter().any(|m| m.as_str() == **r))
        .map(|r| (*r).to_owned())
        .or_else(|| p.default_role.clone())
}

/// Whether the provider may sign this email in.
pub fn domain_allowed(p: &SsoProviderRecord, email: &str) -> bool {
    let domain = email.rsplit('@').next().unwrap_or_default().to_lowercase();
    p.allowed_domains.is_empty() || p.allowed_domains.contains(&domain)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_local_paths_are_returned_to() {
        assert_eq!(return_path(Some("/tasks?x=1")), "/tasks?x=1");
        for evil in [
            "//evil.test",
            "https://evil.test",
            "/\\evil.test",
            "",
            "tasks",
        ] {
            assert_eq!(return_path(Some(evil)), "/", "{evil}");
        }
        assert_eq!(return_path(None), "/");
    }

    #[test]
    fn internal_literals_are_refused_for_organizations() {
        assert!(check_endpoint("https://169.254.169.254/token", false).is_err());
        assert!(check_endpoint("http://127.0.0.1:8080", false).is_err());
        assert!(check_endpoint("http://127.0.0.1:8080", true).is_ok());
        assert!(check_endpoint("http://idp.example.com", true).is_err());
        assert!(check_endpoint("https://idp.example.com", false).is_ok());
    }

    #[tokio::test]
    async fn every_call_to_an_organizations_provider_is_judged_first() {
        // Discovery names these addresses; the client refuses them before connecting.
        let client = reqwest::Client::new();
        for url in [
            "https://10.1.2.3/jwks",
            "https://[::1]/token",
            "http://idp.example.com/keys",
        ] {
            let req = openidconnect::http::Request::builder()
                .uri(url)
                .body(Vec::new())
                .unwrap();
            let err = fetch(&client, false, req).await.unwrap_err().to_string();
            assert!(
                err.contains("internal") || err.contains("not https"),
                "{url}: {err}"
            );
        }
    }

    #[test]
    fn the_strongest_mapped_role_wins() {
        let p = SsoProviderRecord {
            id: "p".into(),
            scope: SsoScope::Tenant("t".into()),
            label: "x".into(),
            issuer: "https://idp.example.com".into(),
            client_id: "c".into(),
            client_secret: "s".into(),
            allowed_domains: vec!["acme.test".into()],
            scopes: vec![],
            role_claim: Some("groups".into()),
            role_map: [
                ("ml".to_owned(), "member".to_owned()),
                ("ops".to_owned(), "admin".to_owned()),
            ]
            .into(),
            default_role: None,
            created_at: 0,
            updated_at: 0,
        };
        let who = |values: &[&str]| Identity {
            subject: "s".into(),
            email: None,
            email_verified: true,
            role_values: values.iter().map(|v| (*v).to_owned()).collect(),
        };
        assert_eq!(role_for(&p, &who(&["ml", "ops"])).as_deref(), Some("admin"));
        assert_eq!(role_for(&p, &who(&["ml"])).as_deref(), Some("member"));
        assert_eq!(role_for(&p, &who(&["sales"])), None);
        assert!(domain_allowed(&p, "ada@ACME.test"));
        assert!(!domain_allowed(&p, "ada@evil.test"));
    }

    /// The generator takes the pattern without its anchors (it makes whole strings anyway).
    fn issuers() -> impl proptest::strategy::Strategy<Value = String> {
        let pattern = crate::domain::names::ISSUER;
        let unanchored = pattern.trim_start_matches('^').trim_end_matches('$');
        proptest::string::string_regex(unanchored).unwrap()
    }

    proptest::proptest! {
        /// The document's issuer pattern promises what the parser keeps: any issuer the request
        /// check lets through is read as a URL, never refused as malformed afterwards.
        #[test]
        fn every_issuer_the_document_allows_is_a_url(
            issuer in issuers()
        ) {
            let req = autodl_common::api::SsoSettingsRequest {
                label: "Idp".into(),
                issuer: issuer.clone(),
                client_id: "c".into(),
                client_secret: Some("s".into()),
                allowed_domains: vec![],
                scopes: vec![],
                role_claim: None,
                role_map: Default::default(),
                default_role: None,
                password_login: None,
            };
            let parsed = parse_settings(&req, SsoScope::Platform, None, 0);
            proptest::prop_assert!(parsed.is_ok(), "{issuer:?}: {:?}", parsed.err());
        }
    }

    #[test]
    fn hosts_that_parsers_read_as_numbers_are_outside_the_issuer_pattern() {
        let pattern = regex::Regex::new(crate::domain::names::ISSUER).unwrap();
        for ok in [
            "https://idp.example.com",
            "http://127.0.0.1:8080/realms/a",
            "https://a-b.c1/",
        ] {
            assert!(pattern.is_match(ok), "{ok}");
        }
        for bad in [
            "https://r.2:65532/x",
            "https://a.0x1f",
            "https://256.1.1.1",
            "https://xn--zz.com",
        ] {
            assert!(!pattern.is_match(bad), "{bad}");
        }
    }
}
