//! Keeping a hydrated page live: periodic polling and Server-Sent Events (log tails), both
//! stopped when the component that started them goes away. On the server they do nothing.

use std::time::Duration;

use autodl_common::tasks::LogLine;
use leptos::prelude::*;

/// Calls `f` every `period` while the current component lives (browser only).
pub fn every(period: Duration, f: impl Fn() + 'static) {
    #[cfg(feature = "hydrate")]
    {
        if let Ok(handle) = set_interval_with_handle(f, period) {
            on_cleanup(move || handle.clear());
        }
    }
    #[cfg(not(feature = "hydrate"))]
    {
        let _ = (period, f);
    }
}

/// A counter bumped every `period`: resources that read it refetch on each tick.
pub fn ticker(period: Duration) -> RwSignal<u64> {
    let tick = RwSignal::new(0u64);
    every(period, move || tick.update(|t| *t += 1));
    tick
}

/// Asks the user to confirm an action that cannot be undone (the browser's own dialog, which
/// keyboards and screen readers already handle). Never confirmed without a browser.
pub fn confirm(question: &str) -> bool {
    #[cfg(feature = "hydrate")]
    {
        web_sys::window()
            .and_then(|w| w.confirm_with_message(question).ok())
            .unwrap_or(false)
    }
    #[cfg(not(feature = "hydrate"))]
    {
        let _ = question;
        false
    }
}

/// Moves keyboard focus to the element with this id (the skip link's target).
pub fn focus(id: &str) {
    #[cfg(feature = "hydrate")]
    {
        use wasm_bindgen::JsCast;
        if let Some(el) = web_sys::window()
            .and_then(|w| w.document())
            .and_then(|d| d.get_element_by_id(id))
            .and_then(|e| e.dyn_into::<web_sys::HtmlElement>().ok())
        {
            let _ = el.focus();
        }
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = id;
}

/// Where the pointer is across the element listening, 0 at its left edge and 1 at its right.
pub fn pointer_fraction(ev: &leptos::ev::PointerEvent) -> Option<f64> {
    #[cfg(feature = "hydrate")]
    {
        use wasm_bindgen::JsCast;
        let el = ev.current_target()?.dyn_into::<web_sys::Element>().ok()?;
        let r = el.get_bounding_client_rect();
        (r.width() > 0.0).then(|| (f64::from(ev.client_x()) - r.left()) / r.width())
    }
    #[cfg(not(feature = "hydrate"))]
    {
        let _ = ev;
        None
    }
}

/// This month as `YYYY-MM` (UTC).
pub fn this_month() -> String {
    #[cfg(feature = "hydrate")]
    {
        let d = js_sys::Date::new_0();
        format!("{:04}-{:02}", d.get_utc_full_year(), d.get_utc_month() + 1)
    }
    #[cfg(all(feature = "ssr", not(feature = "hydrate")))]
    {
        let d = time::OffsetDateTime::now_utc();
        format!("{:04}-{:02}", d.year(), u8::from(d.month()))
    }
    #[cfg(not(any(feature = "ssr", feature = "hydrate")))]
    String::new()
}

/// The state of a log tail.
#[cfg_attr(not(feature = "hydrate"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailStatus {
    Connecting,
    Live,
    Reconnecting,
    Ended,
}

impl TailStatus {
    pub fn label(self) -> &'static str {
        match self {
            TailStatus::Connecting => "connecting…",
            TailStatus::Live => "live",
            TailStatus::Reconnecting => "reconnecting…",
            TailStatus::Ended => "ended",
        }
    }
}

/// Keeps at most this many lines in the page.
#[cfg_attr(not(feature = "hydrate"), allow(dead_code))]
pub const MAX_LOG_LINES: usize = 5000;

/// Tails a task's log through `GET /api/v1/tasks/{id}/logs/stream?after=SEQ`, appending to
/// `lines`; a dropped stream resumes after the last line it delivered.
pub fn tail_logs(task_id: String, lines: RwSignal<Vec<LogLine>>, status: RwSignal<TailStatus>) {
    let url = move || {
        let after = lines
            .with_untracked(|l| l.last().map(|l| l.seq))
            .unwrap_or(0);
        format!("{}?after={after}", crate::paths::task_log_stream(&task_id))
    };
    follow(
        url,
        move |line: LogLine| {
            lines.update(|l| {
                if l.last().is_none_or(|last| last.seq < line.seq) {
                    l.push(line);
                    if l.len() > MAX_LOG_LINES {
                        let extra = l.len() - MAX_LOG_LINES;
                        l.drain(..extra);
                    }
                }
            })
        },
        status,
    );
}

/// Follows a Server-Sent Events stream of JSON items while the current component lives. When
/// the stream drops, it reconnects to `url()` (which names where to resume) after a second; the
/// server's `end` event closes it for good.
pub fn follow<T, U, F>(url: U, on_item: F, status: RwSignal<TailStatus>)
where
    T: serde::de::DeserializeOwned + 'static,
    U: Fn() -> String + Clone + 'static,
    F: Fn(T) + Clone + 'static,
{
    #[cfg(feature = "hydrate")]
    {
        let current = StoredValue::new_local(None::<web_sys::EventSource>);
        let alive = StoredValue::new(true);
        on_cleanup(move || {
            alive.set_value(false);
            current.update_value(|es| {
                if let Some(es) = es.take() {
                    es.close();
                }
            });
        });
        open_stream(url, on_item, status, current, alive);
    }
    #[cfg(not(feature = "hydrate"))]
    {
        let _ = (url, on_item, status);
        let _: Option<T> = None;
    }
}

#[cfg(feature = "hydrate")]
fn open_stream<T, U, F>(
    url: U,
    on_item: F,
    status: RwSignal<TailStatus>,
    current: StoredValue<Option<web_sys::EventSource>, LocalStorage>,
    alive: StoredValue<bool>,
) where
    T: serde::de::DeserializeOwned + 'static,
    U: Fn() -> String + Clone + 'static,
    F: Fn(T) + Clone + 'static,
{
    use wasm_bindgen::closure::Closure;
    use wasm_bindgen::JsCast;

    if !alive.get_value() {
        return;
    }
    let Ok(es) = web_sys::EventSource::new(&url()) else {
        status.set(TailStatus::Reconnecting);
        return;
    };
    let on_open = Closure::<dyn FnMut(web_sys::Event)>::new(move |_| status.set(TailStatus::Live));
    es.set_onopen(Some(on_open.as_ref().unchecked_ref()));
    on_open.forget();
    let handle = on_item.clone();
    let on_message =
        Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |ev: web_sys::MessageEvent| {
            if let Some(item) = ev
                .data()
                .as_string()
                .and_then(|text| serde_json::from_str::<T>(&text).ok())
            {
                handle(item);
            }
        });
    es.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget();
    let on_end = Closure::<dyn FnMut(web_sys::Event)>::new(move |_| {
        current.update_value(|es| {
            if let Some(es) = es.take() {
                es.close();
            }
        });
        status.set(TailStatus::Ended);
    });
    let _ = es.add_event_listener_with_callback("end", on_end.as_ref().unchecked_ref());
    on_end.forget();
    let on_error = Closure::<dyn FnMut(web_sys::Event)>::new(move |_| {
        // The browser would retry from the first URL; reconnect from where we are instead.
        let was_open = current.with_value(|es| es.is_some());
        current.update_value(|es| {
            if let Some(es) = es.take() {
                es.close();
            }
        });
        if !was_open || status.get_untracked() == TailStatus::Ended {
            return;
        }
        status.set(TailStatus::Reconnecting);
        let (url, on_item) = (url.clone(), on_item.clone());
        set_timeout(
            move || open_stream(url, on_item, status, current, alive),
            Duration::from_millis(1000),
        );
    });
    es.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    on_error.forget();
    current.set_value(Some(es));
}

/// Reads a saved value from the browser's localStorage.
pub fn load_local(key: &str) -> Option<String> {
    #[cfg(feature = "hydrate")]
    {
        web_sys::window()?
            .local_storage()
            .ok()??
            .get_item(key)
            .ok()?
    }
    #[cfg(not(feature = "hydrate"))]
    {
        let _ = key;
        None
    }
}

/// Saves a value in the browser's localStorage.
pub fn save_local(key: &str, value: &str) {
    #[cfg(feature = "hydrate")]
    if let Some(s) = web_sys::window().and_then(|w| w.local_storage().ok().flatten()) {
        let _ = s.set_item(key, value);
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = (key, value);
}
