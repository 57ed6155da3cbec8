//! The API's input rules as JSON Schema, added to the generated OpenAPI document.
//!
//! The derive macros describe shapes (types, required fields); what values a field takes
//! (lengths, ranges, name patterns, enums) is said here, next to each other, so the document
//! tells clients exactly what the handlers accept. Request bodies are checked against the
//! result (`openapi::check_body`), so a body the document calls invalid never reaches a
//! handler; the handlers' own checks are at least as wide as what is written here.

/// The names people give things are the domain's rules (`domain::names`), published here.
mod bodies;
mod explain;
mod parameters;

use bodies::component_rules;
use parameters::parameter_rules;
pub use parameters::OBJECT_URL;

pub use explain::explain;

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
