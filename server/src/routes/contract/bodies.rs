//! What values the fields of request and answer bodies take, by component of the document.

use serde_json::{json, Value};

use super::*;

/// One component of a relative path: not empty, not `.` or `..`, no `/` or control character.
const RELATIVE_SEGMENT: &str = r"(?:[^/\u0000-\u001f\u007f-\u009f.]|\.[^/\u0000-\u001f\u007f-\u009f.]|\.\.[^/\u0000-\u001f\u007f-\u009f])[^/\u0000-\u001f\u007f-\u009f]*";

/// `(JSON pointer into components/schemas, keywords merged into the schema found there)`.
pub(super) fn component_rules() -> Vec<(&'static str, Value)> {
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
            json!({"minItems": 1, "items": {"enum": crate::notify::Event::ALL.iter().map(|e| e.as_str()).collect::<Vec<_>>()}}),
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
        // A number of workers, or an elastic task's range of them (min <= max is the
        // spec's rule: a schema cannot compare two fields).
        ("/TaskSpecInput/properties/num_workers", range(1.0, 64.0)),
        ("/WorkerRange/properties/min", range(1.0, 64.0)),
        ("/WorkerRange/properties/max", range(1.0, 64.0)),
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
        // A requirements file is one of the task's code.
        (
            "/TaskSpecInput",
            json!({"dependentRequired": {"requirements": ["code"]}}),
        ),
        (
            "/TaskSpecInput/properties/requirements",
            json!({"maxLength": 512, "pattern": format!("^$|^{RELATIVE_SEGMENT}(?:/{RELATIVE_SEGMENT})*$")}),
        ),
        (
            "/Script",
            json!({"oneOf": [
                {"type": "string", "maxLength": 16384, "pattern": r"^[^\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]*$"},
                {"type": "array", "maxItems": 64,
                 "items": {"type": "string", "maxLength": 255, "pattern": r"^[^\u0000-\u0008\u000a-\u001f\u007f-\u009f]*$"}},
            ]}),
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
