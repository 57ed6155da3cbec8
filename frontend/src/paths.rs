//! The API's paths, built in one place: every page asks here instead of writing
//! `"/api/v1/…"`. Each path comes from one template (the server's own, checked against its
//! OpenAPI document by the server's tests), with its parts percent-encoded. Query strings are
//! the callers'.

/// Where the API lives.
pub const API: &str = "/api/v1";

pub use autodl_common::uri::{encode_component as encode, query};

macro_rules! paths {
    ($($(#[$doc:meta])* $name:ident($($arg:ident),*) => $template:literal;)*) => {
        $(
            $(#[$doc])*
            pub fn $name($($arg: &str),*) -> String {
                format!(concat!("/api/v1", $template), $($arg = encode($arg)),*)
            }
        )*

        /// Every template above, as the server's OpenAPI document writes its paths.
        pub const TEMPLATES: &[&str] = &[$($template,)* "/tasks/{id}/results/files/{path}"];
    };
}

paths! {
    me() => "/me";
    my_notifications() => "/me/notifications";
    login() => "/auth/login";
    logout() => "/auth/logout";
    signup() => "/auth/signup";
    signup_confirm() => "/auth/signup/confirm";
    password() => "/auth/password";
    sso_providers() => "/auth/sso/providers";
    sso_start(id) => "/auth/sso/{id}/start";
    invitation_preview(token) => "/invitations/{token}";
    api_keys() => "/api-keys";
    api_key(id) => "/api-keys/{id}";
    code() => "/code";
    tenant() => "/tenant";
    tenant_quota() => "/tenant/quota";
    tenant_sso() => "/tenant/sso";
    members() => "/tenant/members";
    member(id) => "/tenant/members/{id}";
    member_quota(id) => "/tenant/members/{id}/quota";
    invitations() => "/tenant/invitations";
    invitation(id) => "/tenant/invitations/{id}";
    session_policy() => "/tenant/session-policy";
    webhooks() => "/tenant/webhooks";
    webhook(id) => "/tenant/webhooks/{id}";
    webhook_deliveries(id) => "/tenant/webhooks/{id}/deliveries";
    audit() => "/audit";
    usage_series() => "/usage/series";
    nodes() => "/nodes";
    tasks() => "/tasks";
    task(id) => "/tasks/{id}";
    task_cancel(id) => "/tasks/{id}/cancel";
    task_events(id) => "/tasks/{id}/events";
    task_attempts(id) => "/tasks/{id}/attempts";
    task_checkpoints(id) => "/tasks/{id}/checkpoints";
    task_results(id) => "/tasks/{id}/results";
    task_result_files(id) => "/tasks/{id}/results/files";
    task_log_stream(id) => "/tasks/{id}/logs/stream";
    task_log_download(id) => "/tasks/{id}/logs/download";
    task_metric_lines(id) => "/tasks/{id}/metrics/lines";
    task_metric_stream(id) => "/tasks/{id}/metrics/stream";
    task_shell(id) => "/tasks/{id}/shell";
    task_port_open(id, port) => "/tasks/{id}/ports/{port}/open";
    sweeps() => "/sweeps";
    sweep(id) => "/sweeps/{id}";
    sweep_cancel(id) => "/sweeps/{id}/cancel";
    admin_sso() => "/admin/sso";
    admin_tenants() => "/admin/tenants";
    admin_tenant(id) => "/admin/tenants/{id}";
    admin_tenant_quota(id) => "/admin/tenants/{id}/quota";
    admin_policy() => "/admin/policy";
    admin_users() => "/admin/users";
    admin_user(id) => "/admin/users/{id}";
    admin_usage() => "/admin/usage";
    node_action(id, action) => "/admin/nodes/{id}/{action}";
    registration_tokens() => "/admin/registration-tokens";
    registration_token(id) => "/admin/registration-tokens/{id}";
}

/// One file of a task's results: its path's folders stay folders, each part encoded.
pub fn task_result_file(id: &str, path: &str) -> String {
    format!(
        "{API}/tasks/{}/results/files/{}",
        encode(id),
        path.split('/').map(encode).collect::<Vec<_>>().join("/")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_encoded_and_folders_kept() {
        assert_eq!(task("a b/c"), "/api/v1/tasks/a%20b%2Fc");
        assert_eq!(
            task_port_open("t1", "8080"),
            "/api/v1/tasks/t1/ports/8080/open"
        );
        assert_eq!(
            task_result_file("t1", "out/a b.txt"),
            "/api/v1/tasks/t1/results/files/out/a%20b.txt"
        );
    }
}
