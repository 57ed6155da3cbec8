//! The OpenAPI document, generated from the handlers' annotations and the wire types.

use actix_web::{get, web};
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

pub use super::ApiDoc;

/// Operations anyone may call: no credential is looked at.
const PUBLIC: [(&str, &str); 10] = [
    ("get", "/healthz"),
    ("get", "/auth/sso/providers"),
    ("get", "/auth/sso/{id}/start"),
    ("get", "/auth/sso/callback"),
    ("post", "/auth/signup"),
    ("post", "/auth/signup/confirm"),
    ("post", "/auth/login"),
    ("post", "/auth/logout"),
    ("get", "/invitations/{token}"),
    ("post", "/agent/register"),
];

/// What every operation shares, said once instead of on each handler: public operations need
/// no credential, the others answer 401 without one, and every failure (a malformed request,
/// a body too large, too many attempts, ...) has the JSON error body.
pub struct Conventions;

fn operations(item: &mut PathItem) -> Vec<(&'static str, &mut Operation)> {
    // The methods of `METHODS`, as utoipa holds them.
    let PathItem {
        get,
        put,
        post,
        delete,
        patch,
        ..
    } = item;
    [
        ("get", get),
        ("put", put),
        ("post", post),
        ("delete", delete),
        ("patch", patch),
    ]
    .into_iter()
    .filter_map(|(m, op)| op.as_mut().map(|op| (m, op)))
    .collect()
}

impl Modify for Conventions {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let error = |what: &str| {
            RefOr::T(
                ResponseBuilder::new()
                    .description(what)
                    .content(
                        "application/json",
                        ContentBuilder::new()
                            .schema(Some(RefOr::Ref(Ref::from_schema_name("ErrorBody"))))
                            .build(),
                    )
                    .build(),
            )
        };
        for (path, item) in doc.paths.paths.iter_mut() {
            for (method, op) in operations(item) {
                let responses = &mut op.responses.responses;
                if PUBLIC.contains(&(method, path.as_str())) {
                    op.security = Some(Vec::new());
                } else {
                    responses.entry("401".into()).or_insert_with(|| {
                        error("No credential, or one that is revoked or expired")
                    });
                }
                responses.entry("default".into()).or_insert_with(|| {
                    error("Any other failure; the status says what kind, the body why")
                });
            }
        }
    }
}

/// The document as served: paths under `/api/v1` (the health check at the root) and the
/// input rules of `contract`; built once.
static DOCUMENT: std::sync::LazyLock<serde_json::Value> = std::sync::LazyLock::new(|| {
    let mut doc = ApiDoc::openapi();
    let paths = std::mem::take(&mut doc.paths.paths);
    for (path, item) in paths {
        let full = if path == "/healthz" {
            path
        } else {
            format!("/api/v1{path}")
        };
        doc.paths.paths.insert(full, item);
    }
    let mut doc = serde_json::to_value(&doc).unwrap_or_default();
    for missing in super::contract::apply(&mut doc) {
        tracing::error!(%missing, "an input rule names nothing in the API document");
    }
    doc
});

const METHODS: [&str; 5] = ["get", "put", "post", "delete", "patch"];

/// Validators of the JSON request bodies, by method and path template: a body is checked
/// against the schema the document publishes, so what the document calls invalid is refused
/// and the two cannot drift apart.
static BODY_SCHEMAS: std::sync::LazyLock<
    std::collections::HashMap<(String, String), jsonschema::Validator>,
> = std::sync::LazyLock::new(|| {
    let mut out = std::collections::HashMap::new();
    let components = DOCUMENT["components"].clone();
    let Some(paths) = DOCUMENT["paths"].as_object() else {
        return out;
    };
    for (path, item) in paths {
        for method in METHODS {
            let schema = &item[method]["requestBody"]["content"]["application/json"]["schema"];
            let serde_json::Value::Object(schema) = schema else {
                continue;
            };
            let mut root = serde_json::json!({ "components": components });
            if let Some(root) = root.as_object_mut() {
                root.extend(schema.clone());
            }
            match jsonschema::options()
                .with_draft(jsonschema::Draft::Draft202012)
                .build(&root)
            {
                Ok(v) => {
                    out.insert((method.to_ascii_uppercase(), path.clone()), v);
                }
                Err(e) => {
                    eprintln!("request schema of {method} {path} does not compile: {e}");
                    tracing::error!(%path, method, error = %e, "request schema does not compile")
                }
            }
        }
    }
    out
});

/// Checks a JSON body against the document's schema for the route that matched
/// (`pattern` as actix reports it, e.g. `/api/v1/objects/{bucket}/{path:.*}`); a broken rule
/// is a validation error naming its field.
pub fn check_body(
    method: &str,
    pattern: &str,
    body: &serde_json::Value,
) -> Result<(), crate::error::ApiError> {
    let template: String = {
        let mut t = String::with_capacity(pattern.len());
        let mut in_param = false;
        let mut skipping = false;
        for c in pattern.chars() {
            match c {
                '{' => {
                    in_param = true;
                    t.push(c);
                }
                ':' if in_param => skipping = true,
                '}' => {
                    in_param = false;
                    skipping = false;
                    t.push(c);
                }
                _ if skipping => {}
                _ => t.push(c),
            }
        }
        t
    };
    match BODY_SCHEMAS.get(&(method.to_owned(), template)) {
        Some(v) => v.validate(body).map_err(|e| {
            let (field, message) = super::contract::explain(&e);
            crate::error::ApiError::Validation {
                field: field.map(std::borrow::Cow::Owned),
                message,
            }
        }),
        None => Ok(()),
    }
}

/// Methods the document lists for the path a request names, or `None` when it names no
/// documented path. A trailing `{path}` stands for the rest of the path.
pub fn documented_methods(request_path: &str) -> Option<Vec<&'static str>> {
    let want: Vec<&str> = request_path.trim_end_matches('/').split('/').collect();
    for (template, item) in DOCUMENT["paths"].as_object()?.iter() {
        let parts: Vec<&str> = template.split('/').collect();
        let tail = parts.last().is_some_and(|p| *p == "{path}");
        let fits = if tail {
            want.len() >= parts.len()
                && parts[..parts.len() - 1]
                    .iter()
                    .zip(&want)
                    .all(|(t, w)| t.starts_with('{') || t == w)
        } else {
            parts.len() == want.len()
                && parts
                    .iter()
                    .zip(&want)
                    .all(|(t, w)| (t.starts_with('{') && !w.is_empty()) || t == w)
        };
        if fits {
            return Some(
                METHODS
                    .into_iter()
                    .filter(|m| item.get(*m).is_some())
                    .collect(),
            );
        }
    }
    None
}

pub struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An API key (adl_...) or the token returned by login"))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "session",
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                "autodl_session",
                "Browser session; state-changing requests also need the X-CSRF-Token header",
            ))),
        );
    }
}

/// The document, with the buckets this platform lets tenants use listed where a path names a
/// bucket (a query's `bucket`, such as usage's period, is another thing).
#[get("/openapi.json")]
pub async fn document(state: web::Data<crate::state::AppState>) -> web::Json<serde_json::Value> {
    let mut doc = DOCUMENT.clone();
    let buckets = serde_json::json!({"type": "string", "enum": state.storage.allowed_buckets});
    if let Some(paths) = doc["paths"].as_object_mut() {
        for item in paths.values_mut() {
            for method in METHODS {
                let params = item
                    .get_mut(method)
                    .and_then(|op| op.get_mut("parameters"))
                    .and_then(serde_json::Value::as_array_mut);
                for p in params.into_iter().flatten() {
                    if p["name"] == "bucket" && p["in"] == "path" {
                        p["schema"] = buckets.clone();
                    }
                }
            }
        }
    }
    web::Json(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A path template with its parameters' names left out: `/tasks/{}/events`.
    fn shape(template: &str) -> String {
        let mut out = String::new();
        let mut inside = false;
        for c in template.chars() {
            match c {
                '{' => {
                    inside = true;
                    out.push_str("{}");
                }
                '}' => inside = false,
                c if !inside => out.push(c),
                _ => {}
            }
        }
        out
    }

    #[test]
    fn the_web_app_calls_only_paths_of_the_route_table() {
        let documented: std::collections::BTreeSet<String> = ApiDoc::openapi()
            .paths
            .paths
            .keys()
            .map(|p| shape(p))
            .collect();
        for template in autodl_frontend::paths::TEMPLATES {
            assert!(
                documented.contains(&shape(template)),
                "the web app builds {template}, which the API does not have"
            );
        }
    }

    #[test]
    fn bodies_are_checked_against_the_document() {
        assert!(!BODY_SCHEMAS.is_empty());
        // Every JSON body the document describes compiles into a validator, and every input
        // rule names something the document has.
        let described = DOCUMENT["paths"]
            .as_object()
            .unwrap()
            .values()
            .flat_map(|item| {
                METHODS.map(|m| item[m]["requestBody"]["content"]["application/json"].is_object())
            })
            .filter(|b| *b)
            .count();
        assert_eq!(BODY_SCHEMAS.len(), described);
        let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let paths = doc["paths"].as_object().unwrap().clone();
        doc["paths"] = serde_json::Value::Object(
            paths
                .into_iter()
                .map(|(p, v)| {
                    (
                        if p == "/healthz" {
                            p
                        } else {
                            format!("/api/v1{p}")
                        },
                        v,
                    )
                })
                .collect(),
        );
        assert_eq!(
            crate::routes::contract::apply(&mut doc),
            Vec::<String>::new()
        );
        let ok = json!({"name": "t", "image": "i", "command": "true"});
        assert!(check_body("POST", "/api/v1/tasks", &ok).is_ok());
        for bad in [
            json!([null, null]),
            json!({"name": 3}),
            json!({"name": "t", "surprise": 1}),
        ] {
            assert!(check_body("POST", "/api/v1/tasks", &bad).is_err(), "{bad}");
        }
        // Integer formats bound values: an attempt is an int32.
        let poll = |attempt: u64| json!({"running": [{"task_id": "t", "attempt": attempt}]});
        assert!(check_body("POST", "/api/v1/agent/poll", &poll(2_147_483_647)).is_ok());
        assert!(check_body("POST", "/api/v1/agent/poll", &poll(2_147_483_648)).is_err());
        // Errors name the form field (no item index) and say what is wrong in words.
        let said = |method: &str, path: &str, body: serde_json::Value| match check_body(
            method, path, &body,
        ) {
            Err(crate::error::ApiError::Validation { field, message }) => {
                (field.map(|f| f.into_owned()), message)
            }
            other => panic!("{body}: {other:?}"),
        };
        let (field, message) = said(
            "PUT",
            "/api/v1/tenant/members/{id}/quota",
            json!({"allowed_gpu_types": ["A100", ""]}),
        );
        assert_eq!(field.as_deref(), Some("allowed_gpu_types"));
        assert!(message.starts_with("allowed_gpu_types[1] "), "{message}");
        let (field, message) = said(
            "POST",
            "/api/v1/tasks/{id}/metrics",
            json!({"gpu_util": 0.5}),
        );
        assert_eq!(field.as_deref(), Some("gpu_util"));
        assert_eq!(message, "gpu_util is a reserved name");
        let (field, message) = said(
            "POST",
            "/api/v1/tasks",
            json!({"name": "t", "image": "i", "command": "c", "env": {"AUTODL_TOKEN": "x"}}),
        );
        assert_eq!(field.as_deref(), Some("env"));
        assert!(
            message.contains("\"AUTODL_TOKEN\" is a reserved name"),
            "{message}"
        );
        let (field, message) = said(
            "POST",
            "/api/v1/tasks",
            json!({"name": "t", "image": "i", "command": "c", "checkpoint": {"keep": 0}}),
        );
        assert_eq!(field.as_deref(), Some("checkpoint.keep"));
        // The rule, and a good value of a task's field.
        assert!(
            message.ends_with("must be at least 1 (e.g. 3)"),
            "{message}"
        );
        let (field, message) = said(
            "POST",
            "/api/v1/tasks",
            json!({"name": "t", "image": "i", "command": "c", "resources": {"cpu": 0}}),
        );
        assert_eq!(field.as_deref(), Some("resources.cpu"));
        assert_eq!(message, "resources.cpu must be more than 0 (e.g. 8)");
        let (field, message) = said(
            "POST",
            "/api/v1/tasks",
            json!({"name": "t", "image": "i", "command": "c", "checkpoint": {"save_to": "runs/x"}}),
        );
        assert_eq!(field.as_deref(), Some("checkpoint.save_to"));
        assert!(message.contains("s3://"), "{message}");
        // Patterns with a regex part name the same template.
        assert!(check_body("PATCH", "/api/v1/admin/users/{id}", &json!([true])).is_err());
        assert_eq!(
            documented_methods("/api/v1/objects/autodl/a/b/c"),
            Some(vec!["get", "put", "delete"])
        );
        assert_eq!(documented_methods("/api/v1/nope"), None);
    }
}
