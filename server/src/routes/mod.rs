//! HTTP handlers, one module per resource. Each parses input into domain types, calls the
//! store and maps errors; none holds policy of its own beyond the caller's rights.

pub mod admin;
pub mod agent;
pub mod api_keys;
pub mod artifacts;
pub mod audit;
pub mod auth;
pub mod code;
pub mod contract;
pub mod csv;
pub mod health;
pub mod json;
pub mod nodes;
pub mod notifications;
pub mod openapi;
pub mod sso;
pub mod streams;
pub mod sweeps;
pub mod tasks;
pub mod tenant;
pub mod tunnels;
pub mod usage;
pub mod webhooks;

use actix_web::web;

use crate::domain::rfc3339;
use crate::error::ApiError;
use crate::store::{TenantRecord, UserRecord};
use autodl_common::api::Me;

pub fn configure(cfg: &mut web::ServiceConfig) {
    // Requests to the apps site are the apps proxy's, whatever the path (unknown hosts there
    // are 404, never a page of the platform).
    cfg.service(
        web::scope("")
            .guard(actix_web::guard::fn_guard(|ctx| {
                let host = ctx
                    .head()
                    .headers()
                    .get("host")
                    .and_then(|h| h.to_str().ok());
                ctx.app_data::<web::Data<crate::state::AppState>>()
                    .zip(host)
                    .is_some_and(|(s, h)| s.apps.covers(h))
            }))
            .default_service(web::to(crate::task_web::proxy::serve)),
    )
    .service(
        web::resource("/healthz")
            .route(web::get().to(health::healthz))
            .default_service(web::to(not_routed)),
    )
    .service(crate::prometheus_metrics::endpoint)
    .service(
        web::scope("/api/v1")
            .service(openapi::document)
            .service(auth::signup)
            .service(auth::confirm_signup)
            .service(auth::login)
            .service(auth::logout)
            .service(auth::change_password)
            .service(auth::me)
            .service(sso::providers)
            .service(sso::start)
            .service(sso::callback)
            .service(sso::tenant_settings)
            .service(sso::put_tenant_settings)
            .service(sso::delete_tenant_settings)
            .service(sso::platform_settings)
            .service(sso::put_platform_settings)
            .service(sso::delete_platform_settings)
            .service(api_keys::list)
            .service(api_keys::create)
            .service(api_keys::revoke)
            .service(tenant::show)
            .service(tenant::members)
            .service(tenant::update_member)
            .service(tenant::remove_member)
            .service(tenant::invitations)
            .service(tenant::invite)
            .service(tenant::revoke_invitation)
            .service(tenant::preview_invitation)
            .service(tenant::tenant_quota)
            .service(tenant::member_quota)
            .service(tenant::set_member_quota)
            .service(tenant::session_policy)
            .service(tenant::set_session_policy)
            .service(webhooks::list)
            .service(webhooks::create)
            .service(webhooks::remove)
            .service(webhooks::deliveries)
            .service(audit::list)
            .service(usage::series)
            .service(notifications::show)
            .service(notifications::update)
            .service(admin::tenants)
            .service(admin::set_tenant_quota)
            .service(admin::update_tenant)
            .service(admin::users)
            .service(admin::update_user)
            .service(admin::policy)
            .service(usage::usage)
            .service(tasks::submit)
            .service(sweeps::create)
            .service(sweeps::list)
            .service(sweeps::show)
            .service(sweeps::cancel)
            .service(tasks::list)
            .service(tasks::show)
            .service(tasks::cancel)
            .service(tasks::events)
            .service(tasks::attempts)
            .service(tasks::logs)
            .service(tasks::log_stream)
            .service(tasks::metrics)
            .service(tasks::metric_lines)
            .service(tasks::log_download)
            .service(streams::metric_stream)
            .service(tasks::report_metrics)
            .service(tunnels::shell)
            .service(tunnels::exec)
            .service(tunnels::open_app)
            .service(tunnels::port)
            .service(tunnels::agent_side)
            .service(artifacts::results)
            .service(artifacts::result_files)
            .service(artifacts::result_file)
            .service(artifacts::checkpoints)
            .service(artifacts::list_objects)
            .service(artifacts::put_object)
            .service(artifacts::get_object)
            .service(artifacts::delete_object)
            .service(artifacts::start_upload)
            .service(artifacts::put_file)
            .service(artifacts::commit)
            .service(artifacts::abandon)
            .service(artifacts::get_file)
            .service(artifacts::data_manifest)
            .service(artifacts::data_file)
            .service(code::upload)
            .service(code::show)
            .service(code::download)
            .service(code::for_agent)
            .service(nodes::list)
            .service(nodes::register)
            .service(nodes::remove)
            .service(nodes::set_status)
            .service(agent::create_token)
            .service(agent::list_tokens)
            .service(agent::revoke_token)
            .service(agent::register)
            .service(agent::poll)
            .service(agent::started)
            .service(agent::logs)
            .service(agent::finished)
            .service(agent::not_kept)
            .service(
                web::resource("/agent/metrics")
                    .app_data(crate::routes::json::JsonLimit(agent::METRIC_BODY_LIMIT))
                    .route(web::post().to(agent::metrics)),
            )
            .default_service(web::to(not_routed)),
    );
}

/// A request no handler took: a documented path with another method is 405 (with the methods
/// it takes), anything else 404.
async fn not_routed(req: actix_web::HttpRequest) -> Result<actix_web::HttpResponse, ApiError> {
    match openapi::documented_methods(req.path()) {
        Some(methods) => {
            let allow = methods
                .iter()
                .map(|m| m.to_ascii_uppercase())
                .collect::<Vec<_>>()
                .join(", ");
            let body = autodl_common::api::ErrorBody {
                error: autodl_common::api::ErrorDetail {
                    code: "method_not_allowed".into(),
                    message: format!("{} takes {allow}", req.path()),
                    field: None,
                },
            };
            Ok(actix_web::HttpResponse::MethodNotAllowed()
                .insert_header((actix_web::http::header::ALLOW, allow))
                .json(body))
        }
        None => Err(ApiError::NotFound("no such API endpoint".into())),
    }
}

pub(crate) fn me(user: &UserRecord, tenant: &TenantRecord) -> Result<Me, ApiError> {
    Ok(Me {
        id: user.id.clone(),
        email: user.email.clone(),
        tenant_id: tenant.id.clone(),
        tenant_name: tenant.name.clone(),
        role: crate::auth::caller::parse_role(&user.role)?,
        platform_admin: user.platform_admin,
        created_at: rfc3339(user.created_at),
    })
}
