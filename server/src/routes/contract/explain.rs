//! A broken rule of the contract in a user's words: the field it is about, a sentence, and
//! for a task's fields an example of a good value.

use serde_json::Value;

use super::*;

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
