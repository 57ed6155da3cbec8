//! Hosts the Leptos web app: server-side rendering of its routes and the compiled browser
//! bundle under `/pkg`.
//!
//! A page renders with its data: what it reads, it reads from this server's own REST API
//! over loopback, carrying the cookie of the request being rendered. The page so shows
//! exactly what the API would show that caller (the same handlers, checks and errors), with
//! no second way of reading the store to keep in step.

use actix_web::web;
use leptos::prelude::*;
use leptos_actix::{generate_route_list, LeptosRoutes};

use std::sync::Arc;
use std::time::Duration;

use autodl_frontend::api::ServerFetch;
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

/// Reads of the API made while a page renders: only the API, only GETs, with the caller's
/// cookie and nothing else of theirs.
#[derive(Clone)]
struct Loopback {
    client: reqwest::Client,
    base: String,
}

impl Loopback {
    fn new(listen: std::net::SocketAddr) -> anyhow::Result<Loopback> {
        let ip = match listen.ip() {
            std::net::IpAddr::V4(v4) if v4.is_unspecified() => "127.0.0.1".to_string(),
            std::net::IpAddr::V6(v6) if v6.is_unspecified() => "[::1]".to_string(),
            std::net::IpAddr::V4(v4) => v4.to_string(),
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        };
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()?;
        Ok(Loopback {
            client,
            base: format!("http://{ip}:{}", listen.port()),
        })
    }

    /// Provides the page being rendered with reads as its caller.
    fn provide(&self) {
        let cookie = use_context::<leptos_actix::Request>().and_then(|r| {
            r.headers()
                .get(actix_web::http::header::COOKIE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        });
        let this = self.clone();
        provide_context(ServerFetch(Arc::new(move |path: String| {
            let (this, cookie) = (this.clone(), cookie.clone());
            Box::pin(async move {
                if !path.starts_with("/api/v1/") {
                    return Err(format!("{path} is not part of the API"));
                }
                let mut req = this
                    .client
                    .get(format!("{}{path}", this.base))
                    .header(reqwest::header::ACCEPT, "application/json");
                if let Some(c) = cookie {
                    req = req.header(reqwest::header::COOKIE, c);
                }
                let res = req.send().await.map_err(|e| e.to_string())?;
                let status = res.status().as_u16();
                let body = res.text().await.map_err(|e| e.to_string())?;
                Ok((status, body))
            })
        })));
    }
}

#[derive(Clone)]
pub struct WebApp {
    options: LeptosOptions,
    routes: Vec<leptos_actix::ActixRouteListing>,
    api: Loopback,
}

impl WebApp {
    pub fn new(settings: &Settings, port: u16) -> anyhow::Result<WebApp> {
        let mut addr = settings.listen;
        addr.set_port(port);
        let options = LeptosOptions::builder()
            .output_name("autodl")
            .site_root(settings.site_root.to_string_lossy().to_string())
            .site_pkg_dir("pkg")
            .site_addr(addr)
            .build();
        let routes = generate_route_list(App);
        Ok(WebApp {
            options,
            routes,
            api: Loopback::new(addr)?,
        })
    }

    pub fn configure(&self, cfg: &mut web::ServiceConfig) {
        let pkg = self.options.site_root.to_string();
        let options = self.options.clone();
        let fallback_options = self.options.clone();
        let (api, fallback_api) = (self.api.clone(), self.api.clone());
        cfg.app_data(web::Data::new(self.options.clone()))
            .service(actix_files::Files::new("/pkg", format!("{pkg}/pkg")))
            .leptos_routes(self.routes.clone(), move || {
                with_policy();
                api.provide();
                shell(options.clone())
            })
            // Unknown paths get the app's own "page not found", inside the usual layout.
            .default_service(leptos_actix::render_app_to_stream(
                move || {
                    with_policy();
                    fallback_api.provide();
                    shell(fallback_options.clone())
                },
                leptos_router::Method::Get,
            ));
    }
}
