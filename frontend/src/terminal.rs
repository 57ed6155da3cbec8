//! A terminal in a running task, on its page: xterm.js (served beside the bundle, loaded on
//! the first click) joined to `/api/v1/tasks/{id}/shell` over a WebSocket. The frames are the
//! agent protocol's: a channel byte before output, JSON control messages for the end.

use leptos::prelude::*;

/// The terminal's size: fixed, so the page's layout does not depend on the font.
const COLS: u32 = 100;
const ROWS: u32 = 28;

#[component]
pub fn TerminalPanel(
    /// The task's id.
    task_id: String,
) -> impl IntoView {
    let status = RwSignal::new(String::new());
    let opened = RwSignal::new(false);
    let screen = NodeRef::<leptos::html::Div>::new();
    let path = format!(
        "{}?cols={COLS}&rows={ROWS}",
        crate::paths::task_shell(&task_id)
    );
    let open = move |_| {
        if opened.get_untracked() {
            return;
        }
        opened.set(true);
        status.set("connecting…".into());
        #[cfg(feature = "hydrate")]
        {
            let path = path.clone();
            if let Some(el) = screen.get_untracked() {
                let el: web_sys::HtmlElement = el.into();
                wasm_bindgen_futures::spawn_local(async move {
                    if let Err(e) = browser::connect(el, &path, status).await {
                        status.set(e);
                        opened.set(false);
                    }
                });
            }
        }
        #[cfg(not(feature = "hydrate"))]
        let _ = (&path, screen);
    };
    view! {
        <div class="terminal-bar">
            <button type="button" class="secondary" data-testid="open-terminal" disabled=move || opened.get() on:click=open>"Open a terminal"</button>
            <span class="muted small" data-testid="terminal-status" role="status">{move || status.get()}</span>
        </div>
        <noscript><p class="muted small">"The terminal needs JavaScript; `autodl shell` works from any shell."</p></noscript>
        <div class="terminal" node_ref=screen data-testid="terminal"></div>
    }
}

#[cfg(feature = "hydrate")]
mod browser {
    use js_sys::{Array, Function, Object, Reflect, Uint8Array};
    use leptos::prelude::*;
    use wasm_bindgen::prelude::*;
    use wasm_bindgen::JsCast;
    use web_sys::{BinaryType, MessageEvent, WebSocket};

    fn err(e: JsValue) -> String {
        e.as_string()
            .or_else(|| {
                Reflect::get(&e, &"message".into())
                    .ok()
                    .and_then(|m| m.as_string())
            })
            .unwrap_or_else(|| "the terminal could not start".into())
    }

    /// Loads a script once; resolves when it ran.
    async fn load_script(src: &str) -> Result<(), String> {
        let window = web_sys::window().ok_or("no window")?;
        if Reflect::has(&window, &"Terminal".into()).unwrap_or(false) {
            return Ok(());
        }
        let doc = window.document().ok_or("no document")?;
        let css = doc.create_element("link").map_err(err)?;
        css.set_attribute("rel", "stylesheet").map_err(err)?;
        css.set_attribute("href", "/pkg/xterm.css").map_err(err)?;
        let script = doc.create_element("script").map_err(err)?;
        script.set_attribute("src", src).map_err(err)?;
        let loaded = js_sys::Promise::new(&mut |resolve, reject| {
            let _ = Reflect::set(&script, &"onload".into(), &resolve);
            let _ = Reflect::set(&script, &"onerror".into(), &reject);
        });
        let head = doc.head().ok_or("no head")?;
        head.append_child(&css).map_err(err)?;
        head.append_child(&script).map_err(err)?;
        wasm_bindgen_futures::JsFuture::from(loaded)
            .await
            .map_err(|_| "the terminal's script did not load".to_string())?;
        Ok(())
    }

    fn call(target: &JsValue, method: &str, args: &[&JsValue]) -> Result<JsValue, String> {
        let f: Function = Reflect::get(target, &method.into())
            .map_err(err)?
            .dyn_into()
            .map_err(|_| format!("the terminal has no {method}"))?;
        let list = Array::new();
        for a in args {
            list.push(a);
        }
        f.apply(target, &list).map_err(err)
    }

    pub async fn connect(
        el: web_sys::HtmlElement,
        path: &str,
        status: RwSignal<String>,
    ) -> Result<(), String> {
        load_script("/pkg/xterm.js").await?;
        let window = web_sys::window().ok_or("no window")?;
        let ctor: Function = Reflect::get(&window, &"Terminal".into())
            .map_err(err)?
            .dyn_into()
            .map_err(|_| "the terminal's script did not define Terminal".to_string())?;
        let opts = Object::new();
        for (k, v) in [
            ("cols", JsValue::from(super::COLS)),
            ("rows", JsValue::from(super::ROWS)),
            ("cursorBlink", JsValue::TRUE),
            ("fontSize", JsValue::from(13)),
        ] {
            Reflect::set(&opts, &k.into(), &v).map_err(err)?;
        }
        let term = Reflect::construct(&ctor, &Array::of1(&opts)).map_err(err)?;
        call(&term, "open", &[&el])?;
        let loc = window.location();
        let scheme = if loc.protocol().map_err(err)? == "https:" {
            "wss"
        } else {
            "ws"
        };
        let ws = WebSocket::new(&format!("{scheme}://{}{path}", loc.host().map_err(err)?))
            .map_err(err)?;
        ws.set_binary_type(BinaryType::Arraybuffer);

        let shown = term.clone();
        let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |e: MessageEvent| {
            let data = e.data();
            if let Some(buf) = data.dyn_ref::<js_sys::ArrayBuffer>() {
                let bytes = Uint8Array::new(buf);
                if bytes.length() > 1 && bytes.get_index(0) != 0 {
                    let _ = call(&shown, "write", &[&bytes.subarray(1, bytes.length())]);
                }
            } else if let Some(text) = data.as_string() {
                let c: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                match c["type"].as_str() {
                    Some("exit") => {
                        let code = c["code"].as_i64().unwrap_or(-1);
                        status.set(format!("the shell ended (exit {code})"));
                    }
                    Some("error") => status.set(c["message"].as_str().unwrap_or("").to_owned()),
                    _ => {}
                }
            }
        });
        ws.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        on_message.forget();

        let on_open = Closure::<dyn FnMut()>::new(move || status.set("connected".into()));
        ws.set_onopen(Some(on_open.as_ref().unchecked_ref()));
        on_open.forget();
        let on_close = Closure::<dyn FnMut()>::new(move || {
            status.update(|s| {
                if s.starts_with("connecting") {
                    *s = "could not connect: the task must be running, and only its owner or an \
                          admin of its organization may open a terminal"
                        .into();
                } else if s == "connected" {
                    *s = "disconnected".into();
                }
            })
        });
        ws.set_onclose(Some(on_close.as_ref().unchecked_ref()));
        on_close.forget();

        // Keys go to the shell as they are typed (stdin is channel 0).
        let input = ws.clone();
        let on_data = Closure::<dyn FnMut(JsValue)>::new(move |d: JsValue| {
            if let Some(s) = d.as_string() {
                if input.ready_state() == WebSocket::OPEN {
                    let mut bytes = Vec::with_capacity(s.len() + 1);
                    bytes.push(0u8);
                    bytes.extend_from_slice(s.as_bytes());
                    let _ = input.send_with_u8_array(&bytes);
                }
            }
        });
        call(&term, "onData", &[on_data.as_ref()])?;
        on_data.forget();
        call(&term, "focus", &[])?;
        Ok(())
    }
}
