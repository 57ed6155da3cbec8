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

use autodl_frontend::api::{PageStatus, ServerFetch};
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
    base: reqwest::Url,
}

/// The most a page reads of one API answer: the JSON pages it shows are far smaller, and a
/// path a user can steer (an id in the URL) must not make the server buffer a download.
const MAX_READ_BYTES: usize = 4 << 20;

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
            // The caller's cookie must never go through a proxy from the environment.
            .no_proxy()
            .timeout(Duration::from_secs(10))
            // Idle connections are dropped well before actix's keep-alive (5 s) closes them,
            // so a read does not race the server closing the connection it reuses.
            .pool_idle_timeout(Duration::from_secs(2))
            .build()?;
        Ok(Loopback {
            client,
            base: reqwest::Url::parse(&format!("http://{ip}:{}/", listen.port()))?,
        })
    }

    /// GETs `path` as the caller whose `cookie` this is.
    async fn get(&self, path: &str, cookie: Option<&str>) -> Result<(u16, String), String> {
        let url = self
            .base
            .join(path)
            .map_err(|_| format!("{path} is not a path"))?;
        // Checked once parsed, which has resolved `..` and `%2e` segments.
        if url.origin() != self.base.origin() || !url.path().starts_with("/api/v1/") {
            return Err(format!("{path} is not part of the API"));
        }
        let mut req = self
            .client
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(c) = cookie {
            req = req.header(reqwest::header::COOKIE, c);
        }
        let unreachable = |e: reqwest::Error| {
            tracing::warn!(error = %e, "a page could not read the API");
            "the server could not read its own API".to_owned()
        };
        // A GET is safe to send again: once more when a reused connection was closed under it.
        let again = req.try_clone();
        let mut res = match (req.send().await, again) {
            (Ok(res), _) => res,
            (Err(e), Some(again)) if !e.is_timeout() => {
                tracing::debug!(error = %e, "a page's read of the API is sent again");
                again.send().await.map_err(unreachable)?
            }
            (Err(e), _) => return Err(unreachable(e)),
        };
        let json = res
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if !json && res.status() != reqwest::StatusCode::NO_CONTENT {
            return Err(format!("{path} does not answer JSON"));
        }
        let status = res.status().as_u16();
        let mut body = Vec::new();
        while let Some(chunk) = res.chunk().await.map_err(unreachable)? {
            if body.len() + chunk.len() > MAX_READ_BYTES {
                return Err(format!("{path} answers more than a page shows"));
            }
            body.extend_from_slice(&chunk);
        }
        String::from_utf8(body)
            .map(|b| (status, b))
            .map_err(|_| format!("{path} does not answer text"))
    }

    /// Provides the page being rendered with reads as its caller, and the zone its viewer's
    /// browser said it is in.
    fn provide(&self) {
        let request = use_context::<leptos_actix::Request>();
        if let Some(zone) = request.as_ref().and_then(|r| {
            r.cookie(autodl_frontend::time::ZONE_COOKIE)
                .and_then(|c| autodl_frontend::time::zone_from_cookie(c.value()))
        }) {
            provide_context(zone);
        }
        let cookie = request.and_then(|r| {
            // The session renewed for this page replaces the one the browser sent.
            let renewed = crate::auth::caller::session_cookie_for_reads(&r);
            let mut all: Vec<String> = r
                .headers()
                .get_all(actix_web::http::header::COOKIE)
                .filter_map(|v| v.to_str().ok())
                .flat_map(crate::auth::cookies::pieces)
                .filter(|c| {
                    renewed.is_none()
                        || !crate::auth::cookies::is_one_of(
                            c,
                            &[crate::auth::session::SESSION_COOKIE],
                        )
                })
                .map(str::to_owned)
                .collect();
            all.extend(renewed);
            (!all.is_empty()).then(|| all.join("; "))
        });
        if let Some(res) = use_context::<leptos_actix::ResponseOptions>() {
            provide_context(PageStatus(Arc::new(move |code| {
                if let Ok(status) = actix_web::http::StatusCode::from_u16(code) {
                    res.set_status(status);
                }
            })));
        }
        let this = self.clone();
        // One answer per path for the whole render: leptos's server-side `Suspense` builds a
        // page's body more than once (to find its resource loads, then to render), and each
        // build makes its own resources. Fetched once, every build shows the same data, and
        // it is the data the browser hydrates with; fetched per build, data that changed in
        // between (a task starting) made the HTML disagree with it and hydration fail.
        type Answer = Result<(u16, String), String>;
        type Pending = futures_util::future::Shared<
            std::pin::Pin<Box<dyn std::future::Future<Output = Answer> + Send>>,
        >;
        let answers: Arc<std::sync::Mutex<std::collections::HashMap<String, Pending>>> =
            Default::default();
        provide_context(ServerFetch(Arc::new(move |path: String| {
            use futures_util::FutureExt;
            let pending = {
                let mut answers = answers.lock().unwrap_or_else(|e| e.into_inner());
                answers
                    .entry(path.clone())
                    .or_insert_with(|| {
                        let (this, cookie) = (this.clone(), cookie.clone());
                        let fetch: std::pin::Pin<
                            Box<dyn std::future::Future<Output = Answer> + Send>,
                        > = Box::pin(async move { this.get(&path, cookie.as_deref()).await });
                        fetch.shared()
                    })
                    .clone()
            };
            Box::pin(pending)
        })));
    }
}

/// Where the browser bundle lies.
struct PkgDir(std::path::PathBuf);

/// Serves a file of the bundle, gzipped ahead of time where the build left a fresh `.gz` beside
/// it (`scripts/lib.sh`, the Dockerfile) and the browser takes gzip: compressing the 4 MB wasm
/// on every cold load cost the debug server most of a second, and a build can afford `gzip -9`.
/// Deeper paths (wasm-bindgen's snippets) go to the plain file handler.
async fn bundle_file(
    req: actix_web::HttpRequest,
    dir: web::Data<PkgDir>,
    name: web::Path<String>,
) -> actix_web::Result<actix_web::HttpResponse> {
    use actix_web::http::header::{self, AcceptEncoding, ContentEncoding, Encoding};
    use actix_web::HttpMessage;
    let name = name.into_inner();
    // One plain file name: no separators, no dot-files, nothing that climbs.
    let plain = !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !plain {
        return Err(actix_web::error::ErrorNotFound("no such file"));
    }
    let path = dir.0.join(&name);
    let takes_gzip = req
        .get_header::<AcceptEncoding>()
        .and_then(|a| a.negotiate([Encoding::gzip(), Encoding::identity()].iter()))
        == Some(Encoding::gzip());
    let gz = path.with_file_name(format!("{name}.gz"));
    let fresh = |gz: &std::path::Path| -> Option<()> {
        let (plain, packed) = (std::fs::metadata(&path).ok()?, std::fs::metadata(gz).ok()?);
        (packed.modified().ok()? >= plain.modified().ok()?).then_some(())
    };
    let mut res = if takes_gzip && fresh(&gz).is_some() {
        actix_files::NamedFile::open_async(&gz)
            .await?
            .set_content_type(actix_files::file_extension_to_mime(
                path.extension()
                    .and_then(|e| e.to_str())
                    .unwrap_or_default(),
            ))
            .set_content_encoding(ContentEncoding::Gzip)
            .into_response(&req)
    } else {
        actix_files::NamedFile::open_async(&path)
            .await?
            .into_response(&req)
    };
    res.headers_mut().insert(
        header::VARY,
        header::HeaderValue::from_static("accept-encoding"),
    );
    Ok(res)
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
        let dir = PkgDir(std::path::PathBuf::from(format!("{pkg}/pkg")));
        cfg.app_data(web::Data::new(self.options.clone()))
            .app_data(web::Data::new(dir))
            .service(web::resource("/pkg/{file}").route(web::get().to(bundle_file)))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Nothing listens on port 1: a path that passed the check would fail to connect instead.
    fn loopback() -> Loopback {
        Loopback::new("127.0.0.1:1".parse().unwrap()).unwrap()
    }

    #[tokio::test]
    async fn a_page_reads_only_the_api_of_this_server() {
        let api = loopback();
        for path in [
            "/pkg/autodl.wasm",
            "/api/v1/../../pkg/autodl.wasm",
            "/api/v1/%2e%2e/%2e%2e/healthz",
            "//evil.example/api/v1/me",
            "http://evil.example/api/v1/me",
        ] {
            let err = api.get(path, None).await.unwrap_err();
            assert!(
                err.contains("not part of the API") || err.contains("not a path"),
                "{path}: {err}"
            );
        }
        // An API path passes the check and only then fails to connect.
        let err = api.get("/api/v1/me", None).await.unwrap_err();
        assert_eq!(err, "the server could not read its own API");
    }
}
