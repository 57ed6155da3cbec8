//! The API's input rules as JSON Schema, added to the generated OpenAPI document.
//!
//! The derive macros describe shapes (types, required fields); what values a field takes
//! (lengths, ranges, name patterns, enums) is said here, next to each other, so the document
//! tells clients exactly what the handlers accept. Request bodies are checked against the
//! result (`openapi::check_body`), so a body the document calls invalid never reaches a
//! handler; the handlers' own checks are at least as wide as what is written here.

/// The names people give things are the domain's rules (`domain::names`), published here.
pub use crate::domain::names::{
    EMAIL, ENV_NAME, GPU_TYPE, IDEMPOTENCY_KEY, ISSUER, LABEL_KEY, METRIC_NAME, NODE_ID,
};
use serde_json::{json, Value};

/// One line of text: no control characters, and something besides white space.
pub const TEXT: &str = r"^[^\u0000-\u001f\u007f-\u009f]*[^\s\u0000-\u001f\u007f-\u009f][^\u0000-\u001f\u007f-\u009f]*$";
/// A shell script: like [`TEXT`], with newlines and tabs.
pub const SCRIPT: &str = r"^[^\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]*[^\s\u0000-\u001f\u007f-\u009f][^\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]*$";
/// A quota's GPU types are trimmed first: spaces around a name, none inside it.
pub const QUOTA_GPU_TYPE: &str = r"^ *[A-Za-z0-9._-]{1,64} *$";
/// Sizes: bytes, or a number with a unit.
pub const SIZE_TEXT: &str = r"^[1-9][0-9]{0,5}(\.[0-9]{1,2})? ?([KMGT]i?B|B)$";
/// An absolute folder, normalised: no `.`, `..` or empty segments, not `/` itself.
pub const ABSOLUTE_FOLDER: &str = r"^(/([^/.\u0000-\u001f\u007f-\u009f][^/\u0000-\u001f\u007f-\u009f]*|\.[^/.\u0000-\u001f\u007f-\u009f][^/\u0000-\u001f\u007f-\u009f]*|\.\.[^/\u0000-\u001f\u007f-\u009f]+))+$";
/// A date and time: `2024-03-20T18:00` (UTC), seconds optional, or RFC 3339 with an offset.
pub const DATE_TIME: &str = r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])([T ]([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?|T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-](0[0-9]|1[0-3]):[0-5][0-9]))$";
/// RFC 3339 exactly (cursors of the metric queries).
pub const RFC3339: &str = r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-](0[0-9]|1[0-3]):[0-5][0-9])$";
pub const MONTH: &str = r"^[0-9]{4}-(0[1-9]|1[0-2])$";
/// A UTC date.
pub const DATE: &str = r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])$";
/// A UTC date, or an instant as [`RFC3339`] says it.
pub const DATE_OR_RFC3339: &str = r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])(T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-](0[0-9]|1[0-3]):[0-5][0-9]))?$";
/// An email domain: labels of letters, digits and inner hyphens, at least two.
pub const EMAIL_DOMAIN: &str = r"^[A-Za-z0-9]([A-Za-z0-9-]{0,30}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,30}[A-Za-z0-9])?){1,4}$";
/// A code bundle's id: `sha256:` and the digest in lower-case hex.
pub const CODE_ID: &str = r"^sha256:[0-9a-f]{64}$";

fn text(max: u64) -> Value {
    json!({"minLength": 1, "maxLength": max, "pattern": TEXT})
}

fn pattern(p: &str) -> Value {
    json!({ "pattern": p })
}

fn range(min: f64, max: f64) -> Value {
    json!({"minimum": min, "maximum": max})
}

fn size() -> Value {
    json!({"oneOf": [
        {"type": "integer", "minimum": 1, "maximum": 1_000_000_000_000_000_000u64},
        {"type": "string", "pattern": SIZE_TEXT},
    ]})
}

/// What a rule asks, in a user's words, for the error a broken rule gives.
const PATTERN_HINTS: [(&str, &str); 14] = [
    (TEXT, "must not be blank or hold control characters"),
    (
        SCRIPT,
        "must not be blank or hold control characters other than newlines and tabs",
    ),
    (EMAIL, "is not an email address (name@example.com)"),
    (NODE_ID, "is 1 to 128 letters, digits, '.', '_' or '-'"),
    (
        GPU_TYPE,
        "is not a GPU type name (letters, digits, '.', '_' or '-')",
    ),
    (
        QUOTA_GPU_TYPE,
        "is not a GPU type name (letters, digits, '.', '_' or '-'; spaces only around it)",
    ),
    (
        SIZE_TEXT,
        "is not a size (use e.g. \"20GiB\", \"512MiB\" or a number of bytes)",
    ),
    (
        ABSOLUTE_FOLDER,
        "must be an absolute folder without '.', '..' or empty parts",
    ),
    (ENV_NAME, "is not a valid environment variable name"),
    (LABEL_KEY, "is not a valid label name"),
    (METRIC_NAME, "is not a metric name"),
    (
        DATE_TIME,
        "is not an ISO 8601 date and time (e.g. 2024-03-20T18:00)",
    ),
    (
        RFC3339,
        "is not an RFC 3339 time (e.g. 2024-03-20T18:00:00Z)",
    ),
    (
        CODE_ID,
        "is the id POST /api/v1/code answered: \"sha256:\" and 64 lower-case hex digits",
    ),
];

/// Fields whose alternatives (`anyOf`/`oneOf`) are easier said than listed.
const FIELD_HINTS: [(&str, &str); 9] = [
    ("data_path", "data_path is platform storage (s3://bucket/path) or an absolute folder under a dataset root of the nodes (e.g. /datasets/imagenet)"),
    ("checkpoint.save_to", "checkpoint.save_to is an s3://bucket/path URL or an absolute path in the container"),
    ("command", "command is a shell command (text) or a list of arguments whose first is the program"),
    ("resources.memory", "resources.memory is a size such as \"32GiB\" or a number of bytes"),
    ("resources.gpu.memory", "resources.gpu.memory is a size such as \"20GiB\" or a number of bytes"),
    ("resources.gpu.type", "resources.gpu.type is a GPU type name or a list of them"),
    ("memory", "memory is a size such as \"512GiB\" or a number of bytes"),
    ("gpus", "gpus is {\"type\", \"count\", \"memory\"} or a list of {\"type\", \"memory\"}"),
    ("", "the request is missing a field it needs, or has two that exclude each other"),
];

/// A good value of a task's field, said with a broken rule that does not give one already:
/// the researcher reads the fix instead of working it out from the rule.
const FIELD_EXAMPLES: [(&str, &str); 15] = [
    ("priority", "0.5"),
    ("num_workers", "2"),
    ("resources.cpu", "8"),
    ("resources.gpu.count", "2"),
    ("resources.memory", "\"32GiB\""),
    ("resources.gpu.memory", "\"20GiB\""),
    ("estimated_runtime", "\"90m\""),
    ("time_limit", "\"2h30m\""),
    ("rendezvous_timeout", "\"10m\""),
    ("deadline", "\"2026-12-24T18:00:00Z\""),
    ("checkpoint.interval", "\"10m\""),
    ("checkpoint.keep", "3"),
    ("retry_policy.max_retries", "3"),
    ("batch_size", "64"),
    ("ports", "[8888]"),
];

/// A broken rule as a field, a sentence and, for a task's fields, an example of a good value.
pub fn explain(e: &jsonschema::ValidationError<'_>) -> (Option<String>, String) {
    let (field, message) = explain_rule(e);
    let example = field
        .as_deref()
        .and_then(|f| FIELD_EXAMPLES.iter().find(|(name, _)| *name == f))
        .filter(|_| !message.contains("e.g."));
    match example {
        Some((_, good)) => (field, format!("{message} (e.g. {good})")),
        None => (field, message),
    }
}

fn explain_rule(e: &jsonschema::ValidationError<'_>) -> (Option<String>, String) {
    use jsonschema::error::ValidationErrorKind as K;
    // Forms know a field by its name, not by an item's index: `field` leaves indices out,
    // the message keeps them ("allowed_gpu_types[2] ...") so the caller can find the item.
    let pointer = e.instance_path().to_string();
    let mut field = String::new();
    let mut place = String::new();
    for part in pointer.split('/').skip(1) {
        if part.parse::<usize>().is_ok() {
            place.push_str(&format!("[{part}]"));
            continue;
        }
        for s in [&mut field, &mut place] {
            if !s.is_empty() {
                s.push('.');
            }
            s.push_str(part);
        }
    }
    let shown = if place.is_empty() {
        "the body"
    } else {
        place.as_str()
    };
    let message = match e.kind() {
        K::Required { property } => {
            let p = property.as_str().unwrap_or_default();
            field = if field.is_empty() {
                p.to_string()
            } else {
                format!("{field}.{p}")
            };
            if place.is_empty() {
                format!("{p} is required")
            } else {
                format!("{place}.{p} is required")
            }
        }
        K::AdditionalProperties { unexpected } => {
            let p = unexpected.first().cloned().unwrap_or_default();
            field = if field.is_empty() {
                p.clone()
            } else {
                format!("{field}.{p}")
            };
            if place.is_empty() {
                format!("{p} is not a field of this request")
            } else {
                format!("{place}.{p} is not a field of this request")
            }
        }
        K::MinLength { limit: 1 } => format!("{} is required", shown),
        K::MinLength { limit } => format!("{} must be at least {limit} characters", shown),
        K::MaxLength { limit } => format!("{} must be at most {limit} characters", shown),
        K::Minimum { limit } => format!("{} must be at least {}", shown, number(limit)),
        K::Maximum { limit } => format!("{} must be at most {}", shown, number(limit)),
        K::ExclusiveMinimum { limit } => format!("{} must be more than {}", shown, number(limit)),
        K::ExclusiveMaximum { limit } => format!("{} must be less than {}", shown, number(limit)),
        K::MinItems { limit } => format!("{} needs at least {limit} items", shown),
        K::MaxItems { limit } => format!("{} takes at most {limit} items", shown),
        K::MinProperties { limit } => format!("{} needs at least {limit} entries", shown),
        K::MaxProperties { limit } => format!("{} takes at most {limit} entries", shown),
        K::Enum { options } => format!("{} must be one of {options}", shown),
        K::Type { .. } => format!("{} has the wrong type: {e}", shown),
        K::Pattern { pattern } => match PATTERN_HINTS.iter().find(|(p, _)| p == pattern) {
            Some((_, hint)) => format!("{} {hint}", shown),
            None => format!("{} is not valid", shown),
        },
        K::PropertyNames { error } => {
            let key = error.instance().as_str().unwrap_or_default().to_owned();
            let why = match error.kind() {
                K::Pattern { pattern } => PATTERN_HINTS
                    .iter()
                    .find(|(p, _)| p == pattern)
                    .map_or("is not a valid name", |(_, hint)| *hint),
                K::Not { .. } => "is a reserved name",
                _ => "is not a valid name",
            };
            if place.is_empty() {
                // A key of the body itself is the field at fault.
                field = key.clone();
                format!("{key} {why}")
            } else {
                format!("{shown}: {key:?} {why}")
            }
        }
        K::AnyOf { context } | K::OneOfNotValid { context } => {
            let hint = FIELD_HINTS.iter().find(|(f, _)| *f == field);
            // A field's own hint lists its forms, which says more than why one form failed;
            // a missing field or a fault deeper inside says more than the hint.
            let inner = most_telling(e, context).filter(|inner| {
                hint.is_none()
                    || matches!(inner.kind(), K::Required { .. })
                    || inner.instance_path().to_string() != pointer
            });
            if let Some(inner) = inner {
                return explain(inner);
            }
            match hint {
                Some((_, hint)) => hint.to_string(),
                None => format!("{} is not valid", shown),
            }
        }
        _ => match FIELD_HINTS.iter().find(|(f, _)| *f == field) {
            Some((_, hint)) => hint.to_string(),
            None => format!("{} is not valid: {e}", shown),
        },
    };
    ((!field.is_empty()).then_some(field), message)
}

/// A bound as people write it: `1`, not the `1.0` the document's floats hold.
fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => v.to_string(),
    }
}

/// Of the alternatives that all failed, the error that says most: a missing field, else the
/// one deepest in the body. Errors that only say "not this type here" (the `null` of an
/// optional field) say nothing.
fn most_telling<'a>(
    outer: &jsonschema::ValidationError<'_>,
    branches: &'a [Vec<jsonschema::ValidationError<'static>>],
) -> Option<&'a jsonschema::ValidationError<'static>> {
    use jsonschema::error::ValidationErrorKind as K;
    let here = outer.instance_path().to_string();
    let candidates: Vec<&jsonschema::ValidationError<'static>> = branches
        .iter()
        .flatten()
        .filter(|e| !(matches!(e.kind(), K::Type { .. }) && e.instance_path().to_string() == here))
        .collect();
    candidates
        .iter()
        .find(|e| matches!(e.kind(), K::Required { .. }))
        .or_else(|| {
            candidates
                .iter()
                .max_by_key(|e| e.instance_path().to_string().matches('/').count())
        })
        .copied()
}

/// `(JSON pointer into components/schemas, keywords merged into the schema found there)`.
fn component_rules() -> Vec<(&'static str, Value)> {
    let email = pattern(EMAIL);
    vec![
        ("/SignupRequest/properties/email", email.clone()),
        ("/TaskSpecInput/properties/code", pattern(CODE_ID)),
        (
            "/SignupRequest/properties/password",
            json!({"minLength": 10, "maxLength": 128}),
        ),
        ("/SignupRequest/properties/tenant_name", text(64)),
        (
            "/SignupRequest/properties/invitation",
            json!({"minLength": 1, "maxLength": 256}),
        ),
        // A new organization needs its name; joining one needs the invitation.
        (
            "/SignupRequest",
            json!({"anyOf": [
                {"required": ["tenant_name"], "properties": {"tenant_name": {"type": "string"}}},
                {"required": ["invitation"], "properties": {"invitation": {"type": "string"}}},
            ]}),
        ),
        (
            "/SignupConfirmRequest/properties/token",
            json!({"minLength": 1, "maxLength": 256}),
        ),
        ("/LoginRequest/properties/email", email.clone()),
        (
            "/LoginRequest/properties/password",
            json!({"minLength": 1, "maxLength": 1024}),
        ),
        (
            "/PasswordChangeRequest/properties/current_password",
            json!({"minLength": 1, "maxLength": 1024}),
        ),
        (
            "/PasswordChangeRequest/properties/new_password",
            json!({"minLength": 10, "maxLength": 128}),
        ),
        ("/CreateApiKeyRequest/properties/name", text(64)),
        // Single sign-on. Whether the issuer answers is judged by reading it (a refusal, 403).
        ("/SsoSettingsRequest/properties/label", text(64)),
        (
            "/SsoSettingsRequest/properties/issuer",
            json!({"maxLength": 2048, "pattern": ISSUER}),
        ),
        ("/SsoSettingsRequest/properties/client_id", text(255)),
        ("/SsoSettingsRequest/properties/client_secret", text(1024)),
        (
            "/SsoSettingsRequest/properties/allowed_domains",
            json!({"maxItems": 50, "items": {"pattern": EMAIL_DOMAIN}}),
        ),
        (
            "/SsoSettingsRequest/properties/scopes",
            json!({"maxItems": 20, "items": {"pattern": r"^[A-Za-z0-9_.:/-]{1,64}$"}}),
        ),
        ("/SsoSettingsRequest/properties/role_claim", text(64)),
        (
            "/SsoSettingsRequest/properties/role_map",
            json!({"maxProperties": 100, "propertyNames": {"minLength": 1, "maxLength": 255, "pattern": TEXT},
                   "additionalProperties": {"enum": ["admin", "member"]}}),
        ),
        (
            "/SsoSettingsRequest/properties/default_role",
            json!({"enum": ["admin", "member", null]}),
        ),
        // A role map reads a claim: name it.
        (
            "/SsoSettingsRequest",
            json!({"anyOf": [
                {"properties": {"role_map": {"maxProperties": 0}}},
                {"required": ["role_claim"], "properties": {"role_claim": {"type": "string"}}},
            ]}),
        ),
        (
            "/NotificationSettingsInput/properties/email",
            json!({"items": {"enum": crate::notify::email::EMAIL_EVENTS.map(|e| e.as_str())}}),
        ),
        (
            "/WebhookInput/properties/events",
            json!({"minItems": 1, "items": {"enum": crate::notify::Event::ALL.map(|e| e.as_str())}}),
        ),
        (
            "/CreateApiKeyRequest/properties/expires_in_days",
            range(1.0, 3650.0),
        ),
        ("/CreateInvitationRequest/properties/email", email),
        ("/Quota/properties/max_gpus", range(0.0, 1_000_000.0)),
        ("/Quota/properties/gpu_hours_per_month", range(0.0, 1e9)),
        (
            "/Quota/properties/max_queued_tasks",
            range(0.0, 10_000_000.0),
        ),
        (
            "/Quota/properties/max_storage_bytes",
            range(0.0, i64::MAX as f64),
        ),
        (
            "/Quota/properties/share",
            json!({"exclusiveMinimum": 0, "maximum": 1000}),
        ),
        (
            "/Quota/properties/allowed_gpu_types",
            json!({"maxItems": 64, "items": {"pattern": QUOTA_GPU_TYPE}}),
        ),
        // Tasks.
        ("/TaskSpecInput/properties/name", text(128)),
        ("/TaskSpecInput/properties/image", text(512)),
        ("/TaskSpecInput/properties/entry_point", text(1024)),
        (
            "/TaskSpecInput/properties/env",
            json!({
                "maxProperties": 256,
                "propertyNames": {"pattern": ENV_NAME, "not": {"pattern": "^AUTODL_"}},
                "additionalProperties": {"type": "string", "maxLength": 8192},
            }),
        ),
        ("/TaskSpecInput/properties/num_workers", range(1.0, 64.0)),
        ("/TaskSpecInput/properties/gpu_per_worker", range(0.0, 64.0)),
        ("/TaskSpecInput/properties/priority", range(0.0, 1.0)),
        ("/TaskSpecInput/properties/deadline", pattern(DATE_TIME)),
        // Seconds (a year at most), or text such as "2h30m".
        (
            "/TaskSpecInput/properties/estimated_runtime",
            json!({"minimum": 1, "maximum": 31_536_000, "maxLength": 64}),
        ),
        ("/TaskSpecInput/properties/after", json!({"maxItems": 1000})),
        (
            "/TaskSpecInput/properties/time_limit",
            json!({"minimum": 1, "maximum": 31_536_000, "maxLength": 64}),
        ),
        (
            "/TaskSpecInput/properties/rendezvous_timeout",
            json!({"minimum": 1, "maximum": 31_536_000, "maxLength": 64}),
        ),
        (
            "/TaskSpecInput/properties/data_path",
            json!({"maxLength": 1024, "anyOf": [
                {"pattern": OBJECT_URL},
                {"pattern": ABSOLUTE_FOLDER},
            ]}),
        ),
        (
            "/TaskSpecInput/properties/labels",
            json!({
                "maxProperties": 32,
                "propertyNames": {"pattern": LABEL_KEY},
                "additionalProperties": {"type": "string", "maxLength": 64, "pattern": r"^[^\u0000-\u001f\u007f-\u009f]*$"},
            }),
        ),
        (
            "/TaskSpecInput/properties/batch_size",
            range(1.0, 1_000_000.0),
        ),
        // One of command and entry_point, not both; a session may have neither.
        (
            "/TaskSpecInput",
            json!({
                "if": {"required": ["kind"], "properties": {"kind": {"const": "session"}}},
                "then": {"oneOf": [
                    {"required": ["command"], "properties": {"command": {"not": {"type": "null"}}, "entry_point": {"type": "null"}}},
                    {"required": ["entry_point"], "properties": {"entry_point": {"type": "string"}, "command": {"type": "null"}}},
                    {"properties": {"command": {"type": "null"}, "entry_point": {"type": "null"}}},
                ]},
                "else": {"oneOf": [
                    {"required": ["command"], "properties": {"command": {"not": {"type": "null"}}, "entry_point": {"type": "null"}}},
                    {"required": ["entry_point"], "properties": {"entry_point": {"type": "string"}, "command": {"type": "null"}}},
                ]},
            }),
        ),
        (
            "/TaskSpecInput/properties/ports",
            json!({"maxItems": 16, "items": {"minimum": 1, "maximum": 65535}}),
        ),
        ("/SessionPolicy/properties/idle_util_pct", range(0.0, 100.0)),
        (
            "/SessionPolicy/properties/idle_minutes",
            range(0.0, 10_080.0),
        ),
        (
            "/SessionPolicy/properties/max_session_hours",
            json!({"exclusiveMinimum": 0, "maximum": 8760}),
        ),
        (
            "/SessionPolicy/properties/max_sessions_per_user",
            range(0.0, 10_000.0),
        ),
        (
            "/Command",
            json!({"oneOf": [
                {"type": "string", "maxLength": 16384, "pattern": SCRIPT},
                {"type": "array", "minItems": 1, "maxItems": 1024,
                 "prefixItems": [{"type": "string", "pattern": r"\S"}],
                 "items": {"type": "string", "maxLength": 4096}},
            ]}),
        ),
        ("/Size", size()),
        (
            "/OneOrMany",
            json!({"oneOf": [
                {"type": "string", "pattern": GPU_TYPE},
                {"type": "array", "maxItems": 16, "items": {"type": "string", "pattern": GPU_TYPE}},
            ]}),
        ),
        (
            "/Resources/properties/cpu",
            json!({"exclusiveMinimum": 0, "maximum": 1024}),
        ),
        ("/GpuRequest/properties/count", range(0.0, 64.0)),
        // Seconds, or text such as "10m".
        (
            "/CheckpointInput/properties/interval",
            json!({"minimum": 10, "maximum": 604_800, "maxLength": 64}),
        ),
        ("/CheckpointInput/properties/keep", range(1.0, 100.0)),
        (
            "/CheckpointInput/properties/save_to",
            json!({"maxLength": 1024, "anyOf": [
                {"pattern": OBJECT_URL},
                {"pattern": ABSOLUTE_FOLDER},
            ]}),
        ),
        ("/RetryPolicy/properties/max_retries", range(0.0, 20.0)),
        (
            "/Affinity/properties/zone",
            json!({"enum": ["same", "any", null]}),
        ),
        (
            "/Affinity/properties/bandwidth",
            json!({"enum": ["high", "normal", null]}),
        ),
        // Nodes and agents.
        ("/NodeInput/properties/id", pattern(NODE_ID)),
        ("/NodeInput/properties/zone", json!({"maxLength": 128})),
        ("/NodeInput/properties/labels", json!({"maxProperties": 64})),
        (
            "/NodeInput/properties/cpu",
            json!({"exclusiveMinimum": 0, "maximum": 100_000}),
        ),
        (
            "/NodeInput/properties/data_roots",
            json!({"maxItems": 64, "items": {"pattern": ABSOLUTE_FOLDER}}),
        ),
        (
            "/GpuInventoryInput",
            json!({"oneOf": [
                {"type": "object", "required": ["type", "count", "memory"], "additionalProperties": false,
                 "properties": {"type": {"type": "string", "pattern": GPU_TYPE},
                                "count": {"type": "integer", "minimum": 0, "maximum": 64},
                                "memory": {"$ref": "#/components/schemas/Size"}}},
                {"type": "array", "maxItems": 64, "items": {"type": "object", "required": ["type", "memory"],
                 "additionalProperties": false,
                 "properties": {"type": {"type": "string", "pattern": GPU_TYPE},
                                "memory": {"$ref": "#/components/schemas/Size"}}}},
            ]}),
        ),
        ("/CreateRegistrationToken/properties/name", text(64)),
        (
            "/CreateRegistrationToken/properties/expires_in_hours",
            range(1.0, 8760.0),
        ),
        (
            "/CreateRegistrationToken/properties/max_uses",
            range(1.0, 10_000.0),
        ),
        (
            "/CreateRegistrationToken/properties/node_id",
            pattern(NODE_ID),
        ),
        // A token for one node is used once.
        (
            "/CreateRegistrationToken",
            json!({"if": {"required": ["node_id"], "properties": {"node_id": {"type": "string"}}},
            "then": {"properties": {"max_uses": {"enum": [1, null]}}}}),
        ),
        ("/AgentNode/properties/id", pattern(NODE_ID)),
        // Task ids are the server's own (UUIDs): an agent cannot name a path with one.
        (
            "/RunningRef/properties/task_id",
            json!({"pattern": r"^[A-Za-z0-9-]{1,64}$"}),
        ),
        ("/AgentNode/properties/cpu", json!({"exclusiveMinimum": 0})),
        ("/AgentNode/properties/memory", json!({"minimum": 1})),
        ("/AgentNode/properties/gpus", json!({"maxItems": 64})),
        (
            "/AgentGpu/properties/type",
            json!({"minLength": 1, "maxLength": 64}),
        ),
        ("/AgentGpu/properties/memory", json!({"minimum": 1})),
        (
            "/AgentHost/properties/runtime",
            json!({"enum": ["docker", "process"]}),
        ),
        (
            "/AgentHost/properties/isolation",
            json!({"enum": ["container", "sandbox", "uid", "none"]}),
        ),
        (
            "/AgentHost/properties/data_roots",
            json!({"maxItems": 64, "items": {"pattern": ABSOLUTE_FOLDER}}),
        ),
        (
            "/ArtifactStart/properties/kind",
            json!({"enum": ["checkpoint", "results"]}),
        ),
        (
            "/FinishedReport/properties/reason",
            json!({"enum": ["success", "error", "oom", "stopped"]}),
        ),
        (
            "/FinishedReport/properties/uploading",
            json!({"maxItems": 2, "items": {"enum": ["checkpoint", "results"]}}),
        ),
        (
            "/NotKeptReport/properties/kind",
            json!({"enum": ["checkpoint", "results"]}),
        ),
        ("/LogBatch/properties/lines", json!({"maxItems": 1000})),
        (
            "/AgentLogLine/properties/stream",
            json!({"enum": ["stdout", "stderr"]}),
        ),
        (
            "/MetricBatch/properties/samples",
            json!({"maxItems": 10_000}),
        ),
        ("/GpuSample/properties/util", range(0.0, 1.0)),
        ("/GpuSample/properties/at", pattern(RFC3339)),
    ]
}

/// `s3://bucket/path` in the platform's storage.
pub const OBJECT_URL: &str =
    r"^s3://[a-z0-9][a-z0-9.-]{1,62}(/[^\\\u0000-\u001f\u007f-\u009f]{0,960})?$";

/// `(path, method, parameter name, keywords merged into its schema)`.
/// A JSON array of strings, the first not empty (what `autodl exec` sends as `command`).
const EXEC_COMMAND: &str = r#"^\[[ \t\n\r]*"(?:[^"\\\u0000-\u001f]|\\["\\/bfnrt])+"(?:[ \t\n\r]*,[ \t\n\r]*"(?:[^"\\\u0000-\u001f]|\\["\\/bfnrt])*")*[ \t\n\r]*\]$"#;

fn parameter_rules() -> Vec<(&'static str, &'static str, &'static str, Value)> {
    let states = json!({"enum": autodl_common::tasks::TaskState::ALL.map(|s| s.as_str())});
    vec![
        ("/api/v1/tasks", "get", "state", states),
        ("/api/v1/tasks", "get", "limit", range(1.0, 200.0)),
        (
            "/api/v1/tasks/{id}/shell",
            "get",
            "cols",
            range(1.0, 1000.0),
        ),
        (
            "/api/v1/tasks/{id}/shell",
            "get",
            "rows",
            range(1.0, 1000.0),
        ),
        ("/api/v1/tasks/{id}/exec", "get", "cols", range(1.0, 1000.0)),
        ("/api/v1/tasks/{id}/exec", "get", "rows", range(1.0, 1000.0)),
        (
            "/api/v1/tasks/{id}/exec",
            "get",
            "command",
            json!({"maxLength": 16384, "pattern": EXEC_COMMAND}),
        ),
        (
            "/api/v1/tasks/{id}/ports/{port}",
            "get",
            "port",
            range(1.0, 65535.0),
        ),
        (
            "/api/v1/tasks/{id}/ports/{port}/open",
            "get",
            "port",
            range(1.0, 65535.0),
        ),
        ("/api/v1/tasks", "get", "label", pattern(r"^[^=]*=")),
        (
            "/api/v1/tasks",
            "post",
            "Idempotency-Key",
            pattern(IDEMPOTENCY_KEY),
        ),
        (
            "/api/v1/tasks/{id}/logs",
            "get",
            "limit",
            range(1.0, 5000.0),
        ),
        (
            "/api/v1/tasks",
            "get",
            "cursor",
            pattern(r"^[+-]?[0-9]{1,18}_"),
        ),
        (
            "/api/v1/tasks/{id}/metrics",
            "get",
            "after",
            pattern(RFC3339),
        ),
        (
            "/api/v1/tasks/{id}/metrics",
            "get",
            "limit",
            range(1.0, 10_000.0),
        ),
        (
            "/api/v1/tasks/{id}/metrics/lines",
            "get",
            "from",
            pattern(RFC3339),
        ),
        (
            "/api/v1/tasks/{id}/metrics/lines",
            "get",
            "to",
            pattern(RFC3339),
        ),
        (
            "/api/v1/tasks/{id}/metrics/lines",
            "get",
            "points",
            range(10.0, 5000.0),
        ),
        (
            "/api/v1/tasks/{id}/metrics/stream",
            "get",
            "after",
            pattern(RFC3339),
        ),
        ("/api/v1/admin/usage", "get", "month", pattern(MONTH)),
        ("/api/v1/usage/series", "get", "from", pattern(DATE)),
        ("/api/v1/usage/series", "get", "to", pattern(DATE)),
        (
            "/api/v1/usage/series",
            "get",
            "bucket",
            json!({"enum": ["day", "week", "month", null]}),
        ),
        (
            "/api/v1/usage/series",
            "get",
            "format",
            json!({"enum": ["json", "csv", null]}),
        ),
        ("/api/v1/audit", "get", "since", pattern(DATE_OR_RFC3339)),
        ("/api/v1/audit", "get", "until", pattern(DATE_OR_RFC3339)),
        (
            "/api/v1/audit",
            "get",
            "before",
            range(1.0, i64::MAX as f64),
        ),
        ("/api/v1/audit", "get", "limit", range(1.0, 100_000.0)),
        (
            "/api/v1/audit",
            "get",
            "format",
            json!({"enum": ["json", "csv", null]}),
        ),
        (
            "/api/v1/admin/usage",
            "get",
            "format",
            json!({"enum": ["json", "csv", null]}),
        ),
        ("/api/v1/agent/poll", "post", "wait", range(0.0, 30.0)),
        ("/api/v1/code/{id}", "get", "id", pattern(CODE_ID)),
        ("/api/v1/code/{id}/archive", "get", "id", pattern(CODE_ID)),
        ("/api/v1/sweeps", "get", "limit", range(1.0, 500.0)),
        (
            "/api/v1/admin/nodes/{id}/{action}",
            "post",
            "action",
            json!({"enum": ["cordon", "uncordon", "drain", "open-to-all", "trusted-only"]}),
        ),
    ]
}

/// The body of `POST /tasks/{id}/metrics`: numbers by name.
fn reported_metrics() -> Value {
    json!({
        "type": "object",
        "minProperties": 1,
        "maxProperties": 64,
        "propertyNames": {"pattern": METRIC_NAME, "not": {"enum": ["gpu_util", "mem_used", "mem_total"]}},
        "additionalProperties": {"type": "number"},
    })
}

/// Adds `keywords` to `target`, object into object, so a rule on `items` keeps the type the
/// document already gives them.
fn merge(target: &mut Value, keywords: &Value) {
    if let (Value::Object(t), Value::Object(k)) = (target, keywords) {
        for (key, v) in k {
            match t.get_mut(key) {
                Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                _ => {
                    t.insert(key.clone(), v.clone());
                }
            }
        }
    }
}

/// Adds the rules to the document (as JSON). Rules naming something the document lacks are
/// reported, so a renamed field cannot silently lose its rule.
pub fn apply(doc: &mut Value) -> Vec<String> {
    let mut missing = Vec::new();
    for (pointer, keywords) in component_rules() {
        match doc.pointer_mut(&format!("/components/schemas{pointer}")) {
            Some(s) => merge(s, &keywords),
            None => missing.push(format!("components/schemas{pointer}")),
        }
    }
    for (path, method, name, keywords) in parameter_rules() {
        let params = doc
            .pointer_mut(&format!(
                "/paths/{}/{method}/parameters",
                path.replace('~', "~0").replace('/', "~1")
            ))
            .and_then(Value::as_array_mut);
        let found = params.and_then(|ps| {
            ps.iter_mut()
                .find(|p| p["name"] == name)
                .and_then(|p| p.get_mut("schema"))
        });
        match found {
            Some(s) => merge(s, &keywords),
            None => missing.push(format!("{method} {path} parameter {name}")),
        }
    }
    // An empty object is an object: uploading one needs no body.
    let put_object = "/paths/~1api~1v1~1objects~1{bucket}~1{path}/put/requestBody";
    match doc.pointer_mut(put_object) {
        Some(b) => b["required"] = Value::Bool(false),
        None => missing.push("put /api/v1/objects/{bucket}/{path} body".into()),
    }
    let metrics =
        "/paths/~1api~1v1~1tasks~1{id}~1metrics/post/requestBody/content/application~1json/schema";
    match doc.pointer_mut(metrics) {
        Some(s) => *s = reported_metrics(),
        None => missing.push("post /api/v1/tasks/{id}/metrics body".into()),
    }
    bound_integer_formats(doc);
    missing
}

/// `format: int32` and `int64` bound an integer to those ranges in clients' eyes, but the
/// validator of request bodies does not read formats: the bounds are written out, so a value
/// the document calls out of range (an attempt of 2^31) is refused instead of taken.
fn bound_integer_formats(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let bounds = match map.get("format").and_then(Value::as_str) {
                Some("int32") => Some((json!(i32::MIN), json!(i32::MAX))),
                Some("int64") => Some((json!(i64::MIN), json!(i64::MAX))),
                _ => None,
            };
            if let Some((min, max)) = bounds {
                map.entry("minimum").or_insert(min);
                map.entry("maximum").or_insert(max);
            }
            map.values_mut().for_each(bound_integer_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(bound_integer_formats),
        _ => {}
    }
}
