//! HTTP handlers, one module per resource. Each parses the request into domain types, calls a
//! use case (`usecases/`) and shapes the answer (status, cookies, streams, the audit record);
//! none touches the store or holds a rule of its own. The route table below is the one list of
//! the API's operations: what it registers is what the OpenAPI document describes.

pub mod admin;
pub mod agent;
pub mod api_keys;
pub mod artifacts;
pub mod attachment;
pub mod audit;
pub mod auth;
pub mod code;
pub mod contract;
pub mod csv;
pub mod health;
pub mod json;
pub mod nodes;
pub mod notifications;
pub mod objects;
pub mod openapi;
pub mod prometheus;
pub mod sso;
pub mod streams;
pub mod sweeps;
pub mod tasks;
pub mod tenant;
pub mod tunnels;
pub mod usage;
pub mod webhooks;

use actix_web::web;

use openapi::{Conventions, Security};

use crate::domain::rfc3339;
use crate::error::ApiError;
use crate::store::{TenantRecord, UserRecord};
use autodl_common::api::Me;

/// The API's route table, declared once: every handler here is registered under `/api/v1` and
/// is an operation of the OpenAPI document ([`openapi::ApiDoc`]), from this one list. Outside
/// it: the document itself, `/healthz` and `/agent/metrics` (a larger body limit), registered
/// in [`configure`] and documented through `documented_elsewhere`.
macro_rules! route_table {
    (documented_elsewhere: [$($other:path),* $(,)?], routes: [$($handler:path),* $(,)?]) => {
        fn api_services(scope: actix_web::Scope) -> actix_web::Scope {
            scope$(.service($handler))*
        }

        /// The OpenAPI document: the route table's operations and the wire types.
        #[derive(utoipa::OpenApi)]
        #[openapi(
            info(title = "autodl API", description = "Submit and watch GPU training tasks; manage accounts, organizations and quotas."),
            paths($($other,)* $($handler),*),
            modifiers(&Security, &Conventions),
            security(("bearer" = []), ("session" = []))
        )]
        pub struct ApiDoc;
    };
}

route_table! {
    documented_elsewhere: [health::healthz, agent::metrics],
    routes: [
        auth::signup,
        auth::confirm_signup,
        auth::login,
        auth::logout,
        auth::change_password,
        auth::me,
        sso::providers,
        sso::start,
        sso::callback,
        sso::tenant_settings,
        sso::put_tenant_settings,
        sso::delete_tenant_settings,
        sso::platform_settings,
        sso::put_platform_settings,
        sso::delete_platform_settings,
        api_keys::list,
        api_keys::create,
        api_keys::revoke,
        tenant::show,
        tenant::members,
        tenant::update_member,
        tenant::remove_member,
        tenant::invitations,
        tenant::invite,
        tenant::revoke_invitation,
        tenant::preview_invitation,
        tenant::tenant_quota,
        tenant::member_quota,
        tenant::set_member_quota,
        tenant::session_policy,
        tenant::set_session_policy,
        webhooks::list,
        webhooks::create,
        webhooks::remove,
        webhooks::deliveries,
        audit::list,
        usage::series,
        notifications::show,
        notifications::update,
        admin::tenants,
        admin::set_tenant_quota,
        admin::update_tenant,
        admin::users,
        admin::update_user,
        admin::policy,
        usage::usage,
        tasks::submit,
        sweeps::create,
        sweeps::list,
        sweeps::show,
        sweeps::cancel,
        tasks::list,
        tasks::show,
        tasks::spec_input,
        tasks::cancel,
        tasks::events,
        tasks::attempts,
        tasks::logs,
        tasks::log_stream,
        tasks::metrics,
        tasks::metric_lines,
        tasks::log_download,
        streams::metric_stream,
        tasks::report_metrics,
        tunnels::shell,
        tunnels::exec,
        tunnels::open_app,
        tunnels::port,
        tunnels::agent_side,
        artifacts::results,
        artifacts::result_files,
        artifacts::result_file,
        artifacts::checkpoints,
        objects::list_objects,
        objects::put_object,
        objects::get_object,
        objects::delete_object,
        artifacts::start_upload,
        artifacts::put_file,
        artifacts::commit,
        artifacts::abandon,
        artifacts::get_file,
        artifacts::data_manifest,
        artifacts::data_file,
        code::upload,
        code::show,
        code::download,
        code::for_agent,
        nodes::list,
        nodes::register,
        nodes::remove,
        nodes::set_status,
        agent::create_token,
        agent::list_tokens,
        agent::revoke_token,
        agent::register,
        agent::poll,
        agent::started,
        agent::progress,
        agent::logs,
        agent::finished,
        agent::not_kept,
    ]
}

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
    .service(prometheus::endpoint)
    .service(
        api_services(web::scope("/api/v1").service(openapi::document))
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
        role: user.role,
        platform_admin: user.platform_admin,
        created_at: rfc3339(user.created_at),
    })
}
