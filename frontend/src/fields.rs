//! Pieces every form uses: a labelled input with its error beneath it, the banner for an
//! error that belongs to no field, and a checkbox that shows or hides a chart or a column.

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

/// A checkbox that shows or hides `name` (a chart, a column): ticked while `name` is not in
/// `hidden`.
#[component]
pub fn ShownToggle(
    name: String,
    #[prop(into)] testid: String,
    hidden: RwSignal<std::collections::BTreeSet<String>>,
) -> impl IntoView {
    let (n1, n2) = (name.clone(), name.clone());
    view! {
        <label class="check"><input type="checkbox" data-testid=testid
            prop:checked=move || hidden.with(|h| !h.contains(&n1))
            on:change=move |ev| {
                let on = event_target_checked(&ev);
                hidden.update(|h| { if on { h.remove(&n2); } else { h.insert(n2.clone()); } });
            }/>" "{name}</label>
    }
}
