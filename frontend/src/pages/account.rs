use autodl_common::api::{ApiKeyInfo, CreateApiKeyRequest, CreatedApiKey, PasswordChangeRequest};
use leptos::prelude::*;

use crate::api::{self, ApiErr};
use crate::fields::{general_error, Field};
use crate::paths;
use crate::session::{use_session, RequireLogin};
use crate::time::Time;

#[component]
pub fn AccountPage() -> impl IntoView {
    view! {
        <RequireLogin>
            <Profile/>
            <ApiKeys/>
            <super::notifications::EmailSettings/>
            <super::sso::LinkSso/>
            <ChangePassword/>
        </RequireLogin>
    }
}

#[component]
fn Profile() -> impl IntoView {
    let session = use_session();
    view! {
        <section class="card">
            <h1>"Your account"</h1>
            {move || session.me().map(|me| view! {
                <dl class="facts">
                    <dt>"Email"</dt><dd>{me.email}</dd>
                    <dt>"Organization"</dt><dd>{me.tenant_name}</dd>
                    <dt>"Role"</dt><dd>{me.role.as_str()}{me.platform_admin.then_some(" · platform admin")}</dd>
                    <dt>"Member since"</dt><dd><Time at=me.created_at.clone()/></dd>
                </dl>
            })}
        </section>
    }
}

#[component]
fn ApiKeys() -> impl IntoView {
    let keys = Resource::new(|| (), |_| api::get::<Vec<ApiKeyInfo>>(paths::api_keys()));
    let name = RwSignal::new(String::new());
    let expires = RwSignal::new(String::new());
    let error = RwSignal::new(None::<ApiErr>);
    let created = RwSignal::new(None::<CreatedApiKey>);

    let create = Action::new_local(move |req: &CreateApiKeyRequest| {
        let req = req.clone();
        async move { api::post::<_, CreatedApiKey>(paths::api_keys(), &req).await }
    });
    Effect::new(move |_| match create.value().get() {
        Some(Ok(k)) => {
            created.set(Some(k));
            name.set(String::new());
            keys.refetch();
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    let revoke = Action::new_local(move |id: &String| {
        let id = id.clone();
        async move { api::delete(paths::api_key(&id)).await }
    });
    Effect::new(move |_| match revoke.value().get() {
        Some(Ok(())) => keys.refetch(),
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });

    let on_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        error.set(None);
        let days = expires.get_untracked();
        let expires_in_days = if days.trim().is_empty() {
            None
        } else {
            match days.trim().parse::<u32>() {
                Ok(d) => Some(d),
                Err(_) => {
                    error.set(Some(ApiErr {
                        status: 400,
                        code: "validation".into(),
                        message: "enter a whole number of days, or leave empty".into(),
                        field: Some("expires_in_days".into()),
                    }));
                    return;
                }
            }
        };
        create.dispatch(CreateApiKeyRequest {
            name: name.get_untracked(),
            expires_in_days,
        });
    };

    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <h2>"API keys"</h2>
            <p class="muted">"Programs (the Python client, the CLI) sign in with a key sent as "
                <code>"Authorization: Bearer adl_…"</code>". A key acts as you in your organization."</p>
            {move || created.get().map(|k| {
                let key = k.key.clone();
                view! {
                    <div class="notice key-once" data-testid="new-key">
                        <p><strong>"Copy your new key now."</strong>" It will not be shown again."</p>
                        <div class="key-row">
                            <code data-testid="new-key-value">{k.key.clone()}</code>
                            <button type="button" class="small" on:click=move |_| api::copy_to_clipboard(&key)>"Copy"</button>
                            <button type="button" class="small secondary" on:click=move |_| created.set(None)>"Done"</button>
                        </div>
                    </div>
                }
            })}
            <form class="inline-form" method="post" on:submit=on_submit novalidate>
                <Field label="Key name" id="key-name" value=name placeholder="e.g. laptop"
                    error=Signal::derive(move || error.get().and_then(|e| e.for_field("name")))/>
                <Field label="Expires in (days)" id="key-expiry" kind="number" value=expires placeholder="never"
                    error=Signal::derive(move || error.get().and_then(|e| e.for_field("expires_in_days")))/>
                <button type="submit" disabled=move || create.pending().get()>"Create key"</button>
            </form>
            <p class="banner error" role="alert">{move || general_error(error.get(), &["name", "expires_in_days"])}</p>
            <table class="table" data-testid="api-keys">
                <thead><tr><th>"Name"</th><th>"Key"</th><th>"Created"</th><th>"Last used"</th><th>"Expires"</th><th></th></tr></thead>
                <tbody>
                    {move || match keys.get() {
                        None => view! { <tr><td colspan="6" class="muted">"Loading…"</td></tr> }.into_any(),
                        Some(Err(e)) => view! { <tr><td colspan="6" class="error">{e.message}</td></tr> }.into_any(),
                        Some(Ok(list)) if list.is_empty() => view! { <tr><td colspan="6" class="muted">"No keys yet."</td></tr> }.into_any(),
                        Some(Ok(list)) => list.into_iter().map(|k| {
                            let id = k.id.clone();
                            let row_name = k.name.clone();
                            let row_label = k.name.clone();
                            view! {
                                <tr data-key-name=row_name>
                                    <td>{k.name}</td>
                                    <td><code>{k.prefix}"…"</code></td>
                                    <td><Time at=k.created_at.clone()/></td>
                                    <td>{match k.last_used_at.clone() { Some(at) => view! { <Time at/> }.into_any(), None => "never".into_any() }}</td>
                                    <td>{match k.expires_at.clone() { Some(at) => view! { <Time at/> }.into_any(), None => "never".into_any() }}</td>
                                    <td><button type="button" class="small danger" on:click=move |_| {
                                        if crate::live::confirm(&format!("Revoke the key \"{}\"? Programs using it stop working.", row_label)) { revoke.dispatch(id.clone()); }
                                    }>"Revoke"</button></td>
                                </tr>
                            }
                        }).collect_view().into_any(),
                    }}
                </tbody>
            </table>
        </section>
        </Transition>
    }
}

#[component]
fn ChangePassword() -> impl IntoView {
    let current = RwSignal::new(String::new());
    let new = RwSignal::new(String::new());
    let error = RwSignal::new(None::<ApiErr>);
    let done = RwSignal::new(false);
    let change = Action::new_local(move |req: &PasswordChangeRequest| {
        let req = req.clone();
        async move {
            api::post::<_, api::NoContent>(paths::password(), &req)
                .await
                .map(|_| ())
        }
    });
    Effect::new(move |_| match change.value().get() {
        Some(Ok(())) => {
            done.set(true);
            current.set(String::new());
            new.set(String::new());
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    let on_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        error.set(None);
        done.set(false);
        change.dispatch(PasswordChangeRequest {
            current_password: current.get_untracked(),
            new_password: new.get_untracked(),
        });
    };
    view! {
        <section class="card">
            <h2>"Change password"</h2>
            <form method="post" on:submit=on_submit novalidate>
                <Field label="Current password" id="current_password" kind="password" value=current autocomplete="current-password"
                    error=Signal::derive(move || error.get().and_then(|e| e.for_field("current_password")))/>
                <Field label="New password" id="new_password" kind="password" value=new autocomplete="new-password"
                    error=Signal::derive(move || error.get().and_then(|e| e.for_field("new_password")))/>
                <p class="banner error" role="alert">{move || general_error(error.get(), &["current_password", "new_password"])}</p>
                {move || done.get().then(|| view! { <p class="banner ok">"Password changed. Your other sessions were signed out."</p> })}
                <button type="submit" disabled=move || change.pending().get()>"Change password"</button>
            </form>
        </section>
    }
}
