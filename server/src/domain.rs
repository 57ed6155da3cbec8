//! Request values parsed into types that can only hold valid data, so handlers and the store
//! never see an unchecked email, a weak password or a nonsensical quota.

use autodl_common::api::Quota;

use crate::error::ApiError;
use crate::store::QuotaRecord;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Email(String);

impl Email {
    /// Emails compare case-insensitively; they are kept lower-cased.
    pub fn parse(raw: &str) -> Result<Email, ApiError> {
        let s = raw.trim().to_lowercase();
        if s.is_empty() {
            return Err(ApiError::invalid("email", "email is required"));
        }
        if s.len() > 254 {
            return Err(ApiError::invalid(
                "email",
                "email is longer than 254 characters",
            ));
        }
        if !email_address::EmailAddress::is_valid(&s) || !s.contains('@') || s.contains(' ') {
            return Err(ApiError::invalid(
                "email",
                format!("{s:?} is not a valid email address"),
            ));
        }
        let domain = s.rsplit('@').next().unwrap_or_default();
        if !domain.contains('.') && domain != "localhost" {
            return Err(ApiError::invalid(
                "email",
                format!("{s:?} is not a valid email address"),
            ));
        }
        Ok(Email(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

pub struct Password(String);

impl Password {
    pub const MIN_LEN: usize = 10;
    pub const MAX_LEN: usize = 128;

    pub fn parse(raw: &str, email: Option<&Email>) -> Result<Password, ApiError> {
        let n = raw.chars().count();
        if n < Self::MIN_LEN {
            return Err(ApiError::invalid(
                "password",
                format!("password must be at least {} characters", Self::MIN_LEN),
            ));
        }
        if n > Self::MAX_LEN {
            return Err(ApiError::invalid(
                "password",
                format!("password must be at most {} characters", Self::MAX_LEN),
            ));
        }
        let classes = [
            raw.chars().any(|c| c.is_lowercase()),
            raw.chars().any(|c| c.is_uppercase()),
            raw.chars().any(|c| c.is_ascii_digit()),
            raw.chars().any(|c| !c.is_alphanumeric()),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        let distinct = {
            let mut cs: Vec<char> = raw.chars().collect();
            cs.sort_unstable();
            cs.dedup();
            cs.len()
        };
        if classes < 2 || distinct < 5 {
            return Err(ApiError::invalid(
                "password",
                "password is too weak: mix letters with digits or symbols, and avoid repeats",
            ));
        }
        if let Some(email) = email {
            let local = email.as_str().split('@').next().unwrap_or_default();
            if local.len() >= 4 && raw.to_lowercase().contains(local) {
                return Err(ApiError::invalid(
                    "password",
                    "password must not contain your email name",
                ));
            }
        }
        Ok(Password(raw.to_owned()))
    }

    pub fn into_inner(self) -> String {
        self.0
    }
}

/// A human-readable name (organization, API key): trimmed, 1..=max printable characters.
pub fn parse_name(field: &'static str, raw: &str, max: usize) -> Result<String, ApiError> {
    let s = raw.trim();
    if s.is_empty() {
        return Err(ApiError::invalid(field, format!("{field} is required")));
    }
    if s.chars().count() > max {
        return Err(ApiError::invalid(
            field,
            format!("{field} must be at most {max} characters"),
        ));
    }
    if s.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            field,
            format!("{field} must not contain control characters"),
        ));
    }
    Ok(s.to_owned())
}

/// Checks a quota's values and turns it into the stored form.
pub fn parse_quota(q: &Quota) -> Result<QuotaRecord, ApiError> {
    if q.max_gpus.is_some_and(|n| n > 1_000_000) {
        return Err(ApiError::invalid(
            "max_gpus",
            "max_gpus is unreasonably large",
        ));
    }
    if let Some(h) = q.gpu_hours_per_month {
        if !h.is_finite() || !(0.0..=1e9).contains(&h) {
            return Err(ApiError::invalid(
                "gpu_hours_per_month",
                "gpu_hours_per_month must be a number between 0 and 1e9",
            ));
        }
    }
    if q.max_queued_tasks.is_some_and(|n| n > 10_000_000) {
        return Err(ApiError::invalid(
            "max_queued_tasks",
            "max_queued_tasks is unreasonably large",
        ));
    }
    let types = match &q.allowed_gpu_types {
        None => None,
        Some(list) => {
            if list.len() > 64 {
                return Err(ApiError::invalid(
                    "allowed_gpu_types",
                    "at most 64 GPU types",
                ));
            }
            let mut clean = Vec::with_capacity(list.len());
            for t in list {
                let t = t.trim();
                if t.is_empty()
                    || t.len() > 64
                    || !t
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_. ".contains(c))
                {
                    return Err(ApiError::invalid(
                        "allowed_gpu_types",
                        format!("{t:?} is not a GPU type name"),
                    ));
                }
                if !clean.iter().any(|c: &String| c.eq_ignore_ascii_case(t)) {
                    clean.push(t.to_owned());
                }
            }
            Some(serde_json::to_string(&clean).map_err(anyhow::Error::from)?)
        }
    };
    Ok(QuotaRecord {
        max_gpus: q.max_gpus.map(i64::from),
        gpu_hours_per_month: q.gpu_hours_per_month,
        max_queued_tasks: q.max_queued_tasks.map(i64::from),
        allowed_gpu_types: types,
    })
}

pub fn quota_to_api(r: &QuotaRecord) -> Quota {
    Quota {
        max_gpus: r.max_gpus.map(|n| n as u32),
        gpu_hours_per_month: r.gpu_hours_per_month,
        max_queued_tasks: r.max_queued_tasks.map(|n| n as u32),
        allowed_gpu_types: r
            .allowed_gpu_types
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok()),
    }
}

/// A GPU type is covered by an allowed entry when equal to it or of its family
/// ("A100" covers "A100-40G"), by the same rule the scheduler matches requests with.
pub fn gpu_type_covered(allowed: &[String], t: &str) -> bool {
    allowed
        .iter()
        .any(|a| autodl_scheduler::gpu_type_matches(a, t))
}

/// A user's quota may only narrow the tenant's: every cap the tenant sets bounds the user's.
pub fn check_within(user: &QuotaRecord, tenant: &QuotaRecord) -> Result<(), ApiError> {
    fn over<T: PartialOrd + Copy>(u: Option<T>, t: Option<T>) -> bool {
        match (u, t) {
            (_, None) => false,
            (None, Some(_)) => false,
            (Some(u), Some(t)) => u > t,
        }
    }
    if over(user.max_gpus, tenant.max_gpus) {
        return Err(ApiError::invalid(
            "max_gpus",
            "max_gpus exceeds the organization's cap",
        ));
    }
    if over(user.gpu_hours_per_month, tenant.gpu_hours_per_month) {
        return Err(ApiError::invalid(
            "gpu_hours_per_month",
            "gpu_hours_per_month exceeds the organization's cap",
        ));
    }
    if over(user.max_queued_tasks, tenant.max_queued_tasks) {
        return Err(ApiError::invalid(
            "max_queued_tasks",
            "max_queued_tasks exceeds the organization's cap",
        ));
    }
    let list = |s: &Option<String>| -> Option<Vec<String>> {
        s.as_deref().and_then(|s| serde_json::from_str(s).ok())
    };
    if let Some(tenant_types) = list(&tenant.allowed_gpu_types) {
        match list(&user.allowed_gpu_types) {
            None => {}
            Some(user_types) => {
                if let Some(bad) = user_types
                    .iter()
                    .find(|t| !gpu_type_covered(&tenant_types, t))
                {
                    return Err(ApiError::invalid(
                        "allowed_gpu_types",
                        format!("GPU type {bad:?} is not allowed for the organization"),
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails() {
        assert_eq!(
            Email::parse(" Ada@Example.COM ").unwrap().as_str(),
            "ada@example.com"
        );
        for bad in [
            "",
            "ada",
            "ada@",
            "@example.com",
            "a b@example.com",
            "ada@example",
        ] {
            assert!(Email::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn passwords() {
        assert!(Password::parse("correct-horse-7", None).is_ok());
        for weak in ["short1!", "aaaaaaaaaaaaaaaa", "abcdefghijkl", "1111111111a"] {
            assert!(Password::parse(weak, None).is_err(), "{weak:?} accepted");
        }
        let e = Email::parse("grace@example.com").unwrap();
        assert!(Password::parse("Grace-1234567", Some(&e)).is_err());
    }

    #[test]
    fn user_quota_within_tenant() {
        let tenant = parse_quota(&Quota {
            max_gpus: Some(8),
            allowed_gpu_types: Some(vec!["A100".into()]),
            ..Default::default()
        })
        .unwrap();
        let ok = parse_quota(&Quota {
            max_gpus: Some(4),
            allowed_gpu_types: Some(vec!["A100-40G".into()]),
            ..Default::default()
        })
        .unwrap();
        assert!(check_within(&ok, &tenant).is_ok());
        let too_many = parse_quota(&Quota {
            max_gpus: Some(9),
            ..Default::default()
        })
        .unwrap();
        assert!(check_within(&too_many, &tenant).is_err());
        let wrong_type = parse_quota(&Quota {
            allowed_gpu_types: Some(vec!["A40".into()]),
            ..Default::default()
        })
        .unwrap();
        assert!(check_within(&wrong_type, &tenant).is_err());
    }
}
