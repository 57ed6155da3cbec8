//! Pieces every form uses: a labelled input with its error beneath it, and the banner for
//! an error that belongs to no field.

use leptos::prelude::*;

use crate::api;

/// A labelled input bound to a signal, with its error shown beneath it.
#[component]
pub fn Field(
    #[prop(into)] label: String,
    #[prop(into)] id: String,
    #[prop(into, default = "text".to_string())] kind: String,
    value: RwSignal<String>,
    #[prop(into)] error: Signal<Option<String>>,
    #[prop(into, optional)] autocomplete: Option<String>,
    #[prop(into, optional)] placeholder: Option<String>,
) -> impl IntoView {
    let err_id = format!("{id}-error");
    let kind_is_password = kind == "password";
    let err_id2 = err_id.clone();
    view! {
        <div class="field" class:has-error=move || error.get().is_some()>
            <label for=id.clone()>{label}</label>
            <input
                id=id.clone()
                name=id
                type=kind
                autocomplete=autocomplete
                placeholder=placeholder
                aria-describedby=err_id.clone()
                aria-invalid=move || error.get().is_some().to_string()
                // The attribute too, so the value is in the server's HTML before hydration
                // (never a password's).
                value=move || if kind_is_password { String::new() } else { value.get() }
                bind:value=value
            />
            <p class="field-error" id=err_id2 role="alert">{move || error.get()}</p>
        </div>
    }
}

/// The error of the last attempt that is not about a form field, for a banner.
pub fn general_error(err: Option<api::ApiErr>, fields: &[&str]) -> Option<String> {
    err.filter(|e| e.field.as_deref().is_none_or(|f| !fields.contains(&f)))
        .map(|e| e.message)
}
