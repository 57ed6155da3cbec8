#![recursion_limit = "256"]
//! The autodl web app. The same components render on the server (`ssr`) and hydrate in the
//! browser (`hydrate`); data is fetched from the JSON API after hydration, so every page is
//! served fast and stays correct for whoever is signed in.

pub mod api;
pub mod app;
mod pages;

#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_body(app::App);
}
