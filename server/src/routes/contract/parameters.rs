//! What values path and query parameters take, by operation.

use serde_json::{json, Value};

use super::*;

/// `s3://bucket/path` in the platform's storage.
pub const OBJECT_URL: &str =
    r"^s3://[a-z0-9][a-z0-9.-]{1,62}(/[^\\\u0000-\u001f\u007f-\u009f]{0,960})?$";

/// `(path, method, parameter name, keywords merged into its schema)`.
/// A JSON array of strings, the first not empty (what `autodl exec` sends as `command`).
const EXEC_COMMAND: &str = r#"^\[[ \t\n\r]*"(?:[^"\\\u0000-\u001f]|\\["\\/bfnrt])+"(?:[ \t\n\r]*,[ \t\n\r]*"(?:[^"\\\u0000-\u001f]|\\["\\/bfnrt])*")*[ \t\n\r]*\]$"#;

pub(super) fn parameter_rules() -> Vec<(&'static str, &'static str, &'static str, Value)> {
    let states = json!({"enum": autodl_common::tasks::TaskState::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>()});
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
