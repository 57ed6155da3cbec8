#![recursion_limit = "256"]
//! The autodl web app. The same components render on the server (`ssr`) and hydrate in the
//! browser (`hydrate`): a page's data is read while the server renders it, as the signed-in
//! caller, and handed to hydration with the HTML; live parts take over in the browser.

pub mod api;
pub mod app;
mod chart;
mod fields;
pub mod form;
mod live;
mod pages;
pub mod paths;
mod plot;
mod session;
mod terminal;
pub mod time;

#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_body(app::App);
    // Lets browser tests (and curious users) tell a hydrated page from a static one.
    if let Some(body) = web_sys::window()
        .and_then(|w| w.document())
        .and_then(|d| d.body())
    {
        let _ = body.set_attribute("data-hydrated", "true");
    }
}
