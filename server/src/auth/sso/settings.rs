//! A provider's settings as an administrator gives them, checked field by field, and the rules
//! they set: which email domains the provider admits and which role its claims give.

use super::*;

/// Roles a provider's claims may give: owners are made by people, not by a claim.
const MAPPABLE_ROLES: [&str; 2] = ["admin", "member"];

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
pub fn role_for(p: &SsoProviderRecord, id: &Identity) -> Option<autodl_common::api::Role> {
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
        .and_then(|r| autodl_common::api::Role::parse(&r))
}

/// Whether the provider may sign this email in.
pub fn domain_allowed(p: &SsoProviderRecord, email: &str) -> bool {
    let domain = email.rsplit('@').next().unwrap_or_default().to_lowercase();
    p.allowed_domains.is_empty() || p.allowed_domains.contains(&domain)
}
