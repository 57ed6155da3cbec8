//! Hosts the Leptos web app: server-side rendering of its routes and the compiled browser
//! bundle under `/pkg`.

use actix_web::web;
use leptos::prelude::*;
use leptos_actix::{generate_route_list, LeptosRoutes};

use autodl_frontend::app::{shell, App};

use crate::config::Settings;

/// Sets the page's content policy with the nonce Leptos generated for this response (the
/// integration provides both before it renders the shell).
fn with_policy() {
    if let (Some(nonce), Some(res)) = (
        leptos::nonce::use_nonce(),
        use_context::<leptos_actix::ResponseOptions>(),
    ) {
        res.insert_header(
            actix_web::http::header::CONTENT_SECURITY_POLICY,
            crate::security_headers::page_policy(&nonce.to_string()),
        );
    }
}

#[derive(Clone)]
pub struct WebApp {
    options: LeptosOptions,
    routes: Vec<leptos_actix::ActixRouteListing>,
}

impl WebApp {
    pub fn new(settings: &Settings, port: u16) -> WebApp {
        let mut addr = settings.listen;
        addr.set_port(port);
        let options = LeptosOptions::builder()
            .output_name("autodl")
            .site_root(settings.site_root.to_string_lossy().to_string())
            .site_pkg_dir("pkg")
            .site_addr(addr)
            .build();
        let routes = generate_route_list(App);
        WebApp { options, routes }
    }

    pub fn configure(&self, cfg: &mut web::ServiceConfig) {
        let pkg = self.options.site_root.to_string();
        let options = self.options.clone();
        let fallback_options = self.options.clone();
        cfg.app_data(web::Data::new(self.options.clone()))
            .service(actix_files::Files::new("/pkg", format!("{pkg}/pkg")))
            .leptos_routes(self.routes.clone(), move || {
                with_policy();
                shell(options.clone())
            })
            // Unknown paths get the app's own "page not found", inside the usual layout.
            .default_service(leptos_actix::render_app_to_stream(
                move || {
                    with_policy();
                    shell(fallback_options.clone())
                },
                leptos_router::Method::Get,
            ));
    }
}
