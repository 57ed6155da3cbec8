//! Calls to the JSON API. In the browser, session cookies travel by themselves and the CSRF
//! token is read from its cookie and echoed in a header, as the server requires for writes.
//! While a page renders on the server, reads go through the [`ServerFetch`] the server
//! provides for that request: the same REST API, as the same caller, so a page's HTML holds
//! exactly what the browser would have fetched, and hydration reuses it.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// An API failure, shown next to the form field it names (if any).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ApiErr {
    pub status: u16,
    pub code: String,
    pub message: String,
    pub field: Option<String>,
}

impl ApiErr {
    fn network(e: impl std::fmt::Display) -> Self {
        ApiErr {
            status: 0,
            code: "network".into(),
            message: format!("could not reach the server: {e}"),
            field: None,
        }
    }

    pub fn is_unauthorized(&self) -> bool {
        self.status == 401
    }

    /// The message if it is about `field`, for inline display.
    pub fn for_field(&self, field: &str) -> Option<String> {
        (self.field.as_deref() == Some(field)).then(|| self.message.clone())
    }
}

pub type ApiResult<T> = Result<T, ApiErr>;

pub async fn get<T: DeserializeOwned>(path: impl AsRef<str>) -> ApiResult<T> {
    send::<(), T>("GET", path.as_ref(), None).await
}

pub async fn post<B: Serialize, T: DeserializeOwned>(
    path: impl AsRef<str>,
    body: &B,
) -> ApiResult<T> {
    send("POST", path.as_ref(), Some(body)).await
}

pub async fn put<B: Serialize, T: DeserializeOwned>(
    path: impl AsRef<str>,
    body: &B,
) -> ApiResult<T> {
    send("PUT", path.as_ref(), Some(body)).await
}

pub async fn patch<B: Serialize, T: DeserializeOwned>(
    path: impl AsRef<str>,
    body: &B,
) -> ApiResult<T> {
    send("PATCH", path.as_ref(), Some(body)).await
}

/// For endpoints that answer 204 No Content.
pub async fn delete(path: impl AsRef<str>) -> ApiResult<()> {
    send::<(), NoContent>("DELETE", path.as_ref(), None)
        .await
        .map(|_| ())
}

pub async fn post_empty(path: impl AsRef<str>) -> ApiResult<()> {
    send::<(), NoContent>("POST", path.as_ref(), None)
        .await
        .map(|_| ())
}

/// Deserializes from an empty body as well as from any JSON.
pub struct NoContent;

impl<'de> serde::Deserialize<'de> for NoContent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| NoContent)
    }
}

#[cfg(feature = "hydrate")]
fn send<B: Serialize, T: DeserializeOwned>(
    method: &str,
    path: &str,
    body: Option<&B>,
) -> impl std::future::Future<Output = ApiResult<T>> + Send {
    use gloo_net::http::{Method, RequestBuilder};
    use std::str::FromStr;

    let request = Method::from_str(method)
        .map_err(ApiErr::network)
        .and_then(|method| {
            let mut req = RequestBuilder::new(path)
                .method(method)
                .header("Accept", "application/json");
            if let Some(token) = csrf_token() {
                req = req.header("X-CSRF-Token", &token);
            }
            match body {
                Some(b) => req.json(b).map_err(ApiErr::network),
                None => req.build().map_err(ApiErr::network),
            }
        });
    // The browser is single-threaded; resources only ask that futures could move.
    send_wrapper::SendWrapper::new(async move {
        let resp = request?.send().await.map_err(ApiErr::network)?;
        let status = resp.status();
        let text = resp.text().await.map_err(ApiErr::network)?;
        decode(status, &text)
    })
}

/// How the server answers reads made while it renders a page: the path and query of a GET,
/// answered with the status and body, as the caller whose request is being rendered.
#[cfg(not(feature = "hydrate"))]
#[derive(Clone)]
pub struct ServerFetch(
    #[allow(clippy::type_complexity)]
    pub  std::sync::Arc<
        dyn Fn(
                String,
            ) -> std::pin::Pin<
                Box<dyn std::future::Future<Output = Result<(u16, String), String>> + Send>,
            > + Send
            + Sync,
    >,
);

/// Sets the HTTP status of the page being rendered on the server (a page that is not there
/// answers 404, so crawlers, link checkers and scripts can tell).
#[cfg(not(feature = "hydrate"))]
#[derive(Clone)]
pub struct PageStatus(pub std::sync::Arc<dyn Fn(u16) + Send + Sync>);

/// On the server, pages read through the [`ServerFetch`] of the request being rendered;
/// writes only happen in the browser.
#[cfg(not(feature = "hydrate"))]
async fn send<B: Serialize, T: DeserializeOwned>(
    method: &str,
    path: &str,
    _body: Option<&B>,
) -> ApiResult<T> {
    let fetch = leptos::prelude::use_context::<ServerFetch>()
        .filter(|_| method == "GET")
        .ok_or_else(|| ApiErr::network(format!("{method} {path} is made in the browser")))?;
    let (status, text) = (fetch.0)(path.to_owned()).await.map_err(ApiErr::network)?;
    decode(status, &text)
}

/// The API's answer as `T`, or its error.
fn decode<T: DeserializeOwned>(status: u16, text: &str) -> ApiResult<T> {
    use autodl_common::api::ErrorBody;
    if (200..300).contains(&status) {
        let text = if text.trim().is_empty() { "null" } else { text };
        serde_json::from_str(text).map_err(|e| ApiErr {
            status,
            code: "decode".into(),
            message: format!("unexpected answer from the server: {e}"),
            field: None,
        })
    } else {
        Err(match serde_json::from_str::<ErrorBody>(text) {
            Ok(b) => ApiErr {
                status,
                code: b.error.code,
                message: b.error.message,
                field: b.error.field,
            },
            Err(_) => ApiErr {
                status,
                code: "http".into(),
                message: format!("the server answered {status}"),
                field: None,
            },
        })
    }
}

#[cfg(feature = "hydrate")]
fn csrf_token() -> Option<String> {
    cookie("autodl_csrf")
}

#[cfg(feature = "hydrate")]
fn document() -> Option<web_sys::HtmlDocument> {
    use wasm_bindgen::JsCast;
    web_sys::window()?
        .document()?
        .dyn_into::<web_sys::HtmlDocument>()
        .ok()
}

/// A cookie this page can read.
#[cfg(feature = "hydrate")]
pub fn cookie(name: &str) -> Option<String> {
    let cookies = document()?.cookie().ok()?;
    cookies
        .split(';')
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

/// Keeps a small preference for a year (the server reads it when it renders).
#[cfg(feature = "hydrate")]
pub fn set_cookie(name: &str, value: &str) {
    if let Some(d) = document() {
        let _ = d.set_cookie(&format!(
            "{name}={value}; Path=/; Max-Age=31536000; SameSite=Lax"
        ));
    }
}

/// Copies text to the clipboard where the browser allows it.
pub fn copy_to_clipboard(_text: &str) {
    #[cfg(feature = "hydrate")]
    if let Some(w) = web_sys::window() {
        let _ = w.navigator().clipboard().write_text(_text);
    }
}

/// Asks for `path` and only checks the answer: Ok for 2xx (the body is not read), else the
/// API's error. Used before pointing the browser at a download.
pub async fn probe(path: &str) -> ApiResult<()> {
    #[cfg(feature = "hydrate")]
    {
        let resp = gloo_net::http::Request::get(path)
            .send()
            .await
            .map_err(ApiErr::network)?;
        let status = resp.status();
        if (200..300).contains(&status) {
            return Ok(());
        }
        let text = resp.text().await.unwrap_or_default();
        decode::<NoContent>(status, &text).map(|_| ())
    }
    #[cfg(not(feature = "hydrate"))]
    Err(ApiErr::network(format!("{path} is fetched in the browser")))
}

/// Uploads the file chosen in the file input that fired `ev` as a code bundle; `None` when
/// no file is chosen.
pub async fn upload_code(
    _ev: leptos::ev::Event,
) -> ApiResult<Option<autodl_common::api::CodeBundle>> {
    #[cfg(feature = "hydrate")]
    {
        use wasm_bindgen::JsCast;
        let Some(file) = _ev
            .target()
            .and_then(|t| t.dyn_into::<web_sys::HtmlInputElement>().ok())
            .and_then(|i| i.files())
            .and_then(|f| f.get(0))
        else {
            return Ok(None);
        };
        let mut req = gloo_net::http::Request::post(&crate::paths::code())
            .header("Accept", "application/json")
            .header("Content-Type", "application/octet-stream");
        if let Some(token) = csrf_token() {
            req = req.header("X-CSRF-Token", &token);
        }
        let resp = req
            .body(wasm_bindgen::JsValue::from(file))
            .map_err(ApiErr::network)?
            .send()
            .await
            .map_err(ApiErr::network)?;
        let status = resp.status();
        let text = resp.text().await.map_err(ApiErr::network)?;
        decode(status, &text).map(Some)
    }
    #[cfg(not(feature = "hydrate"))]
    Err(ApiErr::network("files are uploaded from the browser"))
}

/// Points the browser at `path` (a download).
pub fn go_to(_path: &str) {
    #[cfg(feature = "hydrate")]
    if let Some(w) = web_sys::window() {
        let _ = w.location().set_href(_path);
    }
}
