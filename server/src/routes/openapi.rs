//! The OpenAPI document, generated from the handlers' annotations and the wire types.

use actix_web::{get, web};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{
    admin, agent, api_keys, artifacts, auth, health, nodes, streams, tasks, tenant, usage,
};

#[derive(OpenApi)]
#[openapi(
    info(title = "autodl API", description = "Submit and watch GPU training tasks; manage accounts, organizations and quotas."),
    paths(
        health::healthz,
        auth::signup, auth::login, auth::logout, auth::change_password, auth::me,
        api_keys::list, api_keys::create, api_keys::revoke,
        tenant::show, tenant::members, tenant::update_member, tenant::remove_member,
        tenant::invitations, tenant::invite, tenant::revoke_invitation, tenant::preview_invitation,
        tenant::tenant_quota, tenant::member_quota, tenant::set_member_quota,
        admin::tenants, admin::set_tenant_quota, admin::users, admin::update_user, usage::usage,
        tasks::submit, tasks::list, tasks::show, tasks::cancel, tasks::events, tasks::attempts,
        tasks::logs, tasks::log_stream, tasks::metrics, streams::metric_stream, tasks::report_metrics,
        artifacts::results, artifacts::checkpoints, artifacts::list_objects, artifacts::put_object,
        artifacts::get_object, artifacts::delete_object, artifacts::start_upload, artifacts::put_file,
        artifacts::commit, artifacts::get_file, artifacts::data_manifest, artifacts::data_file,
        nodes::list, nodes::register, nodes::remove, nodes::set_status,
        agent::create_token, agent::list_tokens, agent::revoke_token, agent::register, agent::poll,
        agent::started, agent::logs, agent::finished, agent::metrics,
    ),
    modifiers(&Security),
    security(("bearer" = []), ("session" = []))
)]
pub struct ApiDoc;

struct Security;

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

#[get("/openapi.json")]
pub async fn document() -> web::Json<utoipa::openapi::OpenApi> {
    let mut doc = ApiDoc::openapi();
    // Paths are declared relative to the /api/v1 scope, except the health check.
    let paths = std::mem::take(&mut doc.paths.paths);
    for (path, item) in paths {
        let full = if path == "/healthz" {
            path
        } else {
            format!("/api/v1{path}")
        };
        doc.paths.paths.insert(full, item);
    }
    web::Json(doc)
}
