//! Request values parsed into types that can only hold valid data, so handlers and the store
//! never see an unchecked email, a weak password or a nonsensical quota.

use autodl_common::api::Quota;

use crate::error::ApiError;
use crate::store::QuotaRecord;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Email(String);

impl Email {
    /// Emails compare case-insensitively and by their NFKC form, so that look-alikes
    /// (full-width letters, ligatures) cannot make a second account for the same address.
    /// Quoted local parts and comments are refused: no mail system our users have needs them,
    /// and they make one mailbox spellable in many ways.
    pub fn parse(raw: &str) -> Result<Email, ApiError> {
        use unicode_normalization::UnicodeNormalization;
        let s: String = raw.trim().nfkc().collect::<String>().to_lowercase();
        if s.is_empty() {
            return Err(ApiError::invalid("email", "email is required"));
        }
        if s.len() > 254 {
            return Err(ApiError::invalid(
                "email",
                "email is longer than 254 characters",
            ));
        }
        let invalid = || ApiError::invalid("email", format!("{s:?} is not a valid email address"));
        if s.contains(['"', '(', ')', '\\', ' ']) || s.chars().any(char::is_control) {
            return Err(ApiError::invalid(
                "email",
                format!("{s:?} is not a plain email address (no quotes, comments or spaces)"),
            ));
        }
        if !email_address::EmailAddress::is_valid(&s) || s.matches('@').count() != 1 {
            return Err(invalid());
        }
        let domain = s.rsplit('@').next().unwrap_or_default();
        if !domain.contains('.') && domain != "localhost" {
            return Err(invalid());
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
    /// zxcvbn's "safely unguessable" (about 10^10 guesses): dictionary words with a year or
    /// a capital and a digit (`Password12`, `Summer2024`) score lower.
    pub const MIN_SCORE: u8 = 3;

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
        let mut inputs: Vec<&str> = vec!["autodl"];
        if let Some(e) = email {
            inputs.push(e.as_str());
            inputs.extend(e.as_str().split(['@', '.', '-', '_', '+']));
        }
        let estimate = zxcvbn::zxcvbn(raw, &inputs);
        if u8::from(estimate.score()) < Self::MIN_SCORE {
            let hint = estimate
                .feedback()
                .map(|f| {
                    let mut parts: Vec<String> =
                        f.warning().map(|w| w.to_string()).into_iter().collect();
                    parts.extend(f.suggestions().iter().map(|s| s.to_string()));
                    parts.join(" ")
                })
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "Add more words or characters that are hard to guess.".into());
            return Err(ApiError::invalid(
                "password",
                format!("password is too weak (easy to guess): {hint}"),
            ));
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

/// What an agent saves for a task: a checkpoint to resume from, or the task's results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactKind {
    Checkpoint,
    Results,
}

impl ArtifactKind {
    pub fn parse(raw: &str) -> Result<Self, ApiError> {
        match raw {
            "checkpoint" => Ok(ArtifactKind::Checkpoint),
            "results" => Ok(ArtifactKind::Results),
            other => Err(ApiError::invalid(
                "kind",
                format!("kind is \"checkpoint\" or \"results\", not {other:?}"),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ArtifactKind::Checkpoint => "checkpoint",
            ArtifactKind::Results => "results",
        }
    }

    /// The folder of an organization's objects that holds artifacts of this kind.
    pub fn folder(self) -> &'static str {
        match self {
            ArtifactKind::Checkpoint => "checkpoints",
            ArtifactKind::Results => "results",
        }
    }
}

/// A node id, as agents and administrators name nodes: it appears in URLs, logs and task
/// placements, so only 1..=128 letters, digits, '-', '_' or '.'.
pub fn parse_node_id(field: &'static str, raw: &str) -> Result<String, ApiError> {
    let ok = !raw.is_empty()
        && raw.len() <= 128
        && raw
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if !ok {
        return Err(ApiError::invalid(
            field,
            "node id is 1..128 letters, digits, '-', '_' or '.'",
        ));
    }
    Ok(raw.to_owned())
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
    let max_storage_bytes = match q.max_storage_bytes {
        Some(b) => Some(i64::try_from(b).map_err(|_| {
            ApiError::invalid(
                "max_storage_bytes",
                "max_storage_bytes is unreasonably large",
            )
        })?),
        None => None,
    };
    if let Some(share) = q.share {
        if !share.is_finite() || share <= 0.0 || share > 1000.0 {
            return Err(ApiError::invalid(
                "share",
                "share must be a number above 0 and at most 1000",
            ));
        }
    }
    Ok(QuotaRecord {
        share: q.share,
        max_gpus: q.max_gpus.map(i64::from),
        gpu_hours_per_month: q.gpu_hours_per_month,
        max_queued_tasks: q.max_queued_tasks.map(i64::from),
        allowed_gpu_types: types,
        max_storage_bytes,
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
        max_storage_bytes: r.max_storage_bytes.map(|b| b.max(0) as u64),
        share: r.share,
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
        return Err(ApiError::Refused {
            field: "max_gpus",
            message: "max_gpus exceeds the organization's cap".into(),
        });
    }
    if over(user.gpu_hours_per_month, tenant.gpu_hours_per_month) {
        return Err(ApiError::Refused {
            field: "gpu_hours_per_month",
            message: "gpu_hours_per_month exceeds the organization's cap".into(),
        });
    }
    if over(user.max_queued_tasks, tenant.max_queued_tasks) {
        return Err(ApiError::Refused {
            field: "max_queued_tasks",
            message: "max_queued_tasks exceeds the organization's cap".into(),
        });
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
                    return Err(ApiError::Refused {
                        field: "allowed_gpu_types",
                        message: format!("GPU type {bad:?} is not allowed for the organization"),
                    });
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
            "\"ada\"@example.com",
            "\"a@b\"@example.com",
            "ada(comment)@example.com",
            "ada@@example.com",
        ] {
            assert!(Email::parse(bad).is_err(), "{bad:?} accepted");
        }
        // Full-width letters are the same address as their ASCII form.
        assert_eq!(
            Email::parse("ａｄａ@ｅｘａｍｐｌｅ.ｃｏｍ")
                .unwrap()
                .as_str(),
            "ada@example.com"
        );
    }

    #[test]
    fn passwords() {
        // What the suite, the README and the benches use must stay acceptable.
        for ok in [
            "correct-horse-battery-7",
            "Tr41n-all-the-things",
            "Operat0r-secret!",
            "Resear-cher-2024!",
            "Brand-new-pass-9",
            "Bench-passw0rd-1",
            "Dr41n-the-rack-now",
            "N3w-operator-pass",
            "a-long-Passw0rd",
        ] {
            assert!(Password::parse(ok, None).is_ok(), "{ok:?} refused");
        }
        for weak in [
            "short1!",
            "aaaaaaaaaaaaaaaa",
            "abcdefghijkl",
            "1111111111a",
            "Password12",
            "Summer2024",
            "Qwerty123456",
            "iloveyou2024",
        ] {
            assert!(Password::parse(weak, None).is_err(), "{weak:?} accepted");
        }
        let e = Email::parse("grace.hopper@example.com").unwrap();
        assert!(Password::parse("grace.hopper@example.com", Some(&e)).is_err());
        let msg = match Password::parse("Summer2024", None) {
            Err(ApiError::Validation { message, .. }) => message,
            other => panic!("{:?}", other.is_ok()),
        };
        assert!(msg.contains("too weak"), "{msg}");
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
