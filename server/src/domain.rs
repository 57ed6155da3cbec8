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

/// A client's key that makes retrying a submission safe (the `Idempotency-Key` header): 1 to
/// 128 printable ASCII characters, surrounding blanks ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(raw: &str) -> Result<Self, ApiError> {
        let k = raw.trim();
        if k.is_empty() || k.len() > 128 {
            return Err(ApiError::BadRequest(
                "Idempotency-Key must be 1 to 128 characters".into(),
            ));
        }
        if !k.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(ApiError::BadRequest(
                "Idempotency-Key must be printable ASCII".into(),
            ));
        }
        Ok(IdempotencyKey(k.to_owned()))
    }

    pub fn into_inner(self) -> String {
        self.0
    }
}

/// Whether a node takes new tasks: ready, cordoned or draining by an administrator (draining
/// also stops what runs there), or lost (its agent stopped polling; ready again when it polls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeStatus {
    Ready,
    Cordoned,
    Draining,
    Lost,
}

impl NodeStatus {
    pub const ALL: [NodeStatus; 4] = [
        NodeStatus::Ready,
        NodeStatus::Cordoned,
        NodeStatus::Draining,
        NodeStatus::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Ready => "ready",
            NodeStatus::Cordoned => "cordoned",
            NodeStatus::Draining => "draining",
            NodeStatus::Lost => "lost",
        }
    }

    /// The scheduler places new tasks only on ready nodes.
    pub fn takes_new_tasks(self) -> bool {
        self == NodeStatus::Ready
    }
}

/// As a database column holds it.
impl TryFrom<String> for NodeStatus {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        NodeStatus::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown node status {s:?}"))
    }
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

impl std::fmt::Display for ArtifactKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// As a database column holds it.
impl TryFrom<String> for ArtifactKind {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        ArtifactKind::parse(&s).map_err(|_| format!("unknown artifact kind {s:?}"))
    }
}

/// Where an artifact is in its life: its files arrive while uploading; a commit makes it
/// complete (visible, restorable); retention or an abandoned upload has it deleting, then
/// deleted once its objects are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactState {
    Uploading,
    Complete,
    Deleting,
    Deleted,
}

impl ArtifactState {
    pub fn as_str(self) -> &'static str {
        match self {
            ArtifactState::Uploading => "uploading",
            ArtifactState::Complete => "complete",
            ArtifactState::Deleting => "deleting",
            ArtifactState::Deleted => "deleted",
        }
    }
}

impl std::fmt::Display for ArtifactState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for ArtifactState {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        [
            ArtifactState::Uploading,
            ArtifactState::Complete,
            ArtifactState::Deleting,
            ArtifactState::Deleted,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
        .ok_or_else(|| format!("unknown artifact state {s:?}"))
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
    let allowed_gpu_types = AllowedGpuTypes::parse(q.allowed_gpu_types.as_deref())?;
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
        allowed_gpu_types,
        max_storage_bytes,
    })
}

pub fn quota_to_api(r: &QuotaRecord) -> Quota {
    Quota {
        max_gpus: r.max_gpus.map(|n| n as u32),
        gpu_hours_per_month: r.gpu_hours_per_month,
        max_queued_tasks: r.max_queued_tasks.map(|n| n as u32),
        allowed_gpu_types: r.allowed_gpu_types.list().map(<[String]>::to_vec),
        max_storage_bytes: r.max_storage_bytes.map(|b| b.max(0) as u64),
        share: r.share,
    }
}

/// A GPU type name as users, quotas and administrators write it ("A100", "A100-40G",
/// "H200-141G"): 1 to 64 letters, digits, `-`, `_` or `.`, so that every name a task can ask
/// for can also be allowed, declared and matched by family.
pub fn parse_gpu_type(field: &'static str, raw: &str) -> Result<String, ApiError> {
    let t = raw.trim();
    if t.is_empty()
        || t.len() > 64
        || !t
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(ApiError::invalid(
            field,
            format!("{raw:?} is not a GPU type name"),
        ));
    }
    Ok(t.to_owned())
}

/// Which GPU types a quota allows: every type (no list), or those of the listed families.
/// Parsed once, from the API or from the database column, and asked through the rules below,
/// which use the scheduler's own family match ("A100" covers "A100-40G").
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AllowedGpuTypes(Option<Vec<String>>);

impl AllowedGpuTypes {
    /// Names are trimmed, kept once (ignoring case), and must look like GPU type names.
    pub fn parse(list: Option<&[String]>) -> Result<Self, ApiError> {
        let Some(list) = list else {
            return Ok(AllowedGpuTypes(None));
        };
        if list.len() > 64 {
            return Err(ApiError::invalid(
                "allowed_gpu_types",
                "at most 64 GPU types",
            ));
        }
        let mut clean: Vec<String> = Vec::with_capacity(list.len());
        for t in list {
            let t = parse_gpu_type("allowed_gpu_types", t)?;
            if !clean.iter().any(|c| c.eq_ignore_ascii_case(&t)) {
                clean.push(t);
            }
        }
        Ok(AllowedGpuTypes(Some(clean)))
    }

    /// The list; `None` when every type is allowed.
    pub fn list(&self) -> Option<&[String]> {
        self.0.as_deref()
    }

    /// A GPU of type `t` (or every type of the family `t`) is allowed.
    pub fn covers(&self, t: &str) -> bool {
        self.list()
            .is_none_or(|l| l.iter().any(|a| autodl_scheduler::gpu_type_matches(a, t)))
    }

    /// A task asking for `requested` (a type, or a family) may run on some allowed type: the
    /// request names an allowed family or a type of one ("A100" allows "A100-40G"), or a
    /// family an allowed type is of (asking for "A100" with only "A100-40G" allowed: the
    /// scheduler then places it on the allowed variant only).
    pub fn admits_request(&self, requested: &str) -> bool {
        self.list().is_none_or(|l| {
            l.iter().any(|a| {
                autodl_scheduler::gpu_type_matches(a, requested)
                    || autodl_scheduler::gpu_type_matches(requested, a)
            })
        })
    }

    /// Every type listed here is allowed by `wider`; otherwise the first that is not. No list
    /// here narrows nothing: the wider list still applies.
    pub fn within<'a>(&'a self, wider: &Self) -> Result<(), &'a str> {
        match self.list() {
            None => Ok(()),
            Some(l) => match l.iter().find(|t| !wider.covers(t)) {
                Some(bad) => Err(bad),
                None => Ok(()),
            },
        }
    }

    /// As the database column holds it: a JSON array, or NULL for every type.
    pub fn to_column(&self) -> Option<String> {
        self.0
            .as_ref()
            .map(|l| serde_json::to_string(l).unwrap_or_else(|_| "[]".into()))
    }
}

impl TryFrom<Option<String>> for AllowedGpuTypes {
    type Error = String;

    fn try_from(column: Option<String>) -> Result<Self, Self::Error> {
        match column {
            None => Ok(AllowedGpuTypes(None)),
            Some(s) => serde_json::from_str(&s)
                .map(|l| AllowedGpuTypes(Some(l)))
                .map_err(|e| format!("allowed GPU types {s:?}: {e}")),
        }
    }
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
    if let Err(bad) = user.allowed_gpu_types.within(&tenant.allowed_gpu_types) {
        return Err(ApiError::Refused {
            field: "allowed_gpu_types",
            message: format!("GPU type {bad:?} is not allowed for the organization"),
        });
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

    #[test]
    fn allowed_gpu_types_one_rule() {
        let a100 = AllowedGpuTypes::parse(Some(&["A100".into(), " a100 ".into()])).unwrap();
        assert_eq!(a100.list(), Some(&["A100".to_owned()][..]));
        assert!(a100.covers("A100-40G") && !a100.covers("A40"));
        let variant = AllowedGpuTypes::parse(Some(&["A100-40G".into()])).unwrap();
        assert!(variant.admits_request("A100") && !variant.covers("A100"));
        assert!(!variant.admits_request("H100"));
        assert_eq!(variant.within(&a100), Ok(()));
        assert_eq!(a100.within(&variant), Err("A100"));
        let all = AllowedGpuTypes::default();
        assert!(all.covers("anything") && all.within(&a100).is_ok());
        for t in [all, a100, variant] {
            assert_eq!(AllowedGpuTypes::try_from(t.to_column()), Ok(t));
        }
        assert!(AllowedGpuTypes::try_from(Some("not json".to_owned())).is_err());
        assert!(AllowedGpuTypes::parse(Some(&["A100;".into()])).is_err());
    }
}
