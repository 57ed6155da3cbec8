//! Calls to the JSON API from the browser. Session cookies travel by themselves; the CSRF
//! token is read from its cookie and echoed in a header, as the server requires for writes.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// An API failure, shown next to the form field it names (if any).
#[derive(Debug, Clone, PartialEq)]
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

pub async fn get<T: DeserializeOwned>(path: &str) -> ApiResult<T> {
    send::<(), T>("GET", path, None).await
}

pub async fn post<B: Serialize, T: DeserializeOwned>(path: &str, body: &B) -> ApiResult<T> {
    send("POST", path, Some(body)).await
}

pub async fn put<B: Serialize, T: DeserializeOwned>(path: &str, body: &B) -> ApiResult<T> {
    send("PUT", path, Some(body)).await
}

pub async fn patch<B: Serialize, T: DeserializeOwned>(path: &str, body: &B) -> ApiResult<T> {
    send("PATCH", path, Some(body)).await
}

/// For endpoints that answer 204 No Content.
pub async fn delete(path: &str) -> ApiResult<()> {
    send::<(), NoContent>("DELETE", path, None)
        .await
        .map(|_| ())
}

pub async fn post_empty(path: &str) -> ApiResult<()> {
    send::<(), NoContent>("POST", path, None).await.map(|_| ())
}

/// Deserializes from an empty body as well as from any JSON.
pub struct NoContent;

impl<'de> serde::Deserialize<'de> for NoContent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| NoContent)
    }
}

#[cfg(feature = "hydrate")]
async fn send<B: Serialize, T: DeserializeOwned>(
    method: &str,
    path: &str,
    body: Option<&B>,
) -> ApiResult<T> {
    use autodl_common::api::ErrorBody;
    use gloo_net::http::{Method, RequestBuilder};
    use std::str::FromStr;

    let method = Method::from_str(method).map_err(ApiErr::network)?;
    let mut req = RequestBuilder::new(path)
        .method(method)
        .header("Accept", "application/json");
    if let Some(token) = csrf_token() {
        req = req.header("X-CSRF-Token", &token);
    }
    let resp = match body {
        Some(b) => req.json(b).map_err(ApiErr::network)?.send().await,
        None => req.send().await,
    }
    .map_err(ApiErr::network)?;
    let status = resp.status();
    let text = resp.text().await.map_err(ApiErr::network)?;
    if (200..300).contains(&status) {
        let text = if text.trim().is_empty() {
            "null"
        } else {
            text.as_str()
        };
        serde_json::from_str(text).map_err(|e| ApiErr {
            status,
            code: "decode".into(),
            message: format!("unexpected answer from the server: {e}"),
            field: None,
        })
    } else {
        Err(match serde_json::from_str::<ErrorBody>(&text) {
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

/// On the server, pages render without data and fetch it once hydrated; nothing calls this.
#[cfg(not(feature = "hydrate"))]
async fn send<B: Serialize, T: DeserializeOwned>(
    _method: &str,
    path: &str,
    _body: Option<&B>,
) -> ApiResult<T> {
    Err(ApiErr::network(format!("{path} is fetched in the browser")))
}

#[cfg(feature = "hydrate")]
fn csrf_token() -> Option<String> {
    use wasm_bindgen::JsCast;
    let doc = web_sys::window()?
        .document()?
        .dyn_into::<web_sys::HtmlDocument>()
        .ok()?;
    let cookies = doc.cookie().ok()?;
    cookies
        .split(';')
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == "autodl_csrf")
        .map(|(_, v)| v.to_owned())
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
        use autodl_common::api::ErrorBody;
        let resp = gloo_net::http::Request::get(path)
            .send()
            .await
            .map_err(ApiErr::network)?;
        let status = resp.status();
        if (200..300).contains(&status) {
            return Ok(());
        }
        let text = resp.text().await.unwrap_or_default();
        Err(match serde_json::from_str::<ErrorBody>(&text) {
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
    #[cfg(not(feature = "hydrate"))]
    Err(ApiErr::network(format!("{path} is fetched in the browser")))
}

/// Points the browser at `path` (a download).
pub fn go_to(_path: &str) {
    #[cfg(feature = "hydrate")]
    if let Some(w) = web_sys::window() {
        let _ = w.location().set_href(_path);
    }
}
