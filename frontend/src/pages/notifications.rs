//! Telling people what happened: each person's email choices (on the account page) and the
//! organization's webhooks (on the organization page, for its owners and admins).

use autodl_common::api::{
    NotificationSettings, NotificationSettingsInput, Webhook, WebhookDelivery, WebhookInput,
};
use leptos::prelude::*;

use crate::api::{self, ApiErr};
use crate::fields::general_error;
use crate::paths;
use crate::time::Time;

/// The events, in the words of the person they concern.
fn label(event: &str) -> &'static str {
    match event {
        "task.finished" => "A task completed",
        "task.failed" => "A task failed for good or ran out of time",
        "task.idle" => "A task's GPUs sit idle",
        "task.idle_stopped" => "A task was stopped for being idle",
        "node.lost" => "A node running tasks stopped answering (they are requeued)",
        "quota.nearly_used" => "80% (then all) of a monthly GPU-hour quota is used",
        _ => "Another event",
    }
}

/// Every event a webhook may ask for.
const WEBHOOK_EVENTS: [&str; 6] = [
    "task.finished",
    "task.failed",
    "task.idle",
    "task.idle_stopped",
    "node.lost",
    "quota.nearly_used",
];

/// Checkboxes over `events`, the chosen ones in `chosen`; checked as `initial` without scripts.
fn event_boxes(
    prefix: &'static str,
    events: Vec<String>,
    initial: Vec<String>,
    chosen: RwSignal<Vec<String>>,
    enabled: bool,
) -> impl IntoView {
    events
        .into_iter()
        .map(|e| {
            let (e1, e2) = (e.clone(), e.clone());
            view! {
                <label class="check">
                    <input type="checkbox" name=prefix value=e.clone() data-testid=format!("{prefix}-{e}") disabled=!enabled
                        checked=initial.contains(&e)
                        prop:checked=move || chosen.with(|c| c.contains(&e1))
                        on:change=move |ev| {
                            let on = event_target_checked(&ev);
                            chosen.update(|c| {
                                c.retain(|x| x != &e2);
                                if on { c.push(e2.clone()); }
                            });
                        }/>
                    " " {label(&e)} " " <code class="small muted">{e.clone()}</code>
                </label>
            }
        })
        .collect_view()
}

#[component]
pub fn EmailSettings() -> impl IntoView {
    let settings = Resource::new(
        || (),
        |_| api::get::<NotificationSettings>(paths::my_notifications()),
    );
    let chosen = RwSignal::new(Vec::<String>::new());
    let outcome = RwSignal::new(None::<Result<(), ApiErr>>);
    Effect::new(move |_| {
        if let Some(Ok(s)) = settings.get() {
            chosen.set(s.email);
        }
    });
    let save = Action::new_local(move |email: &Vec<String>| {
        let body = NotificationSettingsInput {
            email: email.clone(),
        };
        async move { api::put::<_, NotificationSettings>(paths::my_notifications(), &body).await }
    });
    Effect::new(move |_| match save.value().get() {
        Some(Ok(s)) => {
            chosen.set(s.email);
            outcome.set(Some(Ok(())));
        }
        Some(Err(e)) => outcome.set(Some(Err(e))),
        None => {}
    });
    view! {
        <section class="card" data-testid="email-settings">
            <h2>"Email notifications"</h2>
            <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || settings.get().map(|r| match r {
                Err(e) => view! { <p class="banner error" role="alert">{e.message}</p> }.into_any(),
                Ok(s) => {
                    let available = s.email_available;
                    view! {
                        <p class="muted">{if available {
                            format!("Choose what is emailed to {}.", s.address)
                        } else {
                            "This server sends no email: its operator has not set up a mail server.".to_owned()
                        }}</p>
                        <form class="stack" on:submit=move |ev| {
                            ev.prevent_default();
                            outcome.set(None);
                            save.dispatch(chosen.get_untracked());
                        }>
                            {event_boxes("email", s.events.clone(), s.email.clone(), chosen, available)}
                            <div><button type="submit" data-testid="email-save" disabled=!available>"Save"</button></div>
                        </form>
                    }.into_any()
                }
            })}
            {move || match outcome.get() {
                Some(Ok(())) => view! { <p class="banner ok" data-testid="email-saved">"Saved."</p> }.into_any(),
                Some(Err(e)) => view! { <p class="banner error" role="alert">{general_error(Some(e), &[])}</p> }.into_any(),
                None => ().into_any(),
            }}
            </Transition>
        </section>
    }
}

#[component]
pub fn Webhooks() -> impl IntoView {
    let hooks = Resource::new(|| (), |_| api::get::<Vec<Webhook>>(paths::webhooks()));
    let url = RwSignal::new(String::new());
    let chosen = RwSignal::new(vec!["task.failed".to_owned()]);
    let error = RwSignal::new(None::<ApiErr>);
    let created = RwSignal::new(None::<Webhook>);
    let shown = RwSignal::new(None::<String>);
    let add = Action::new_local(move |input: &WebhookInput| {
        let input = input.clone();
        async move { api::post::<_, Webhook>(paths::webhooks(), &input).await }
    });
    Effect::new(move |_| match add.value().get() {
        Some(Ok(w)) => {
            error.set(None);
            url.set(String::new());
            created.set(Some(w));
            hooks.refetch();
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    let remove = Action::new_local(move |id: &String| {
        let path = paths::webhook(id);
        async move { api::delete(&path).await }
    });
    Effect::new(move |_| match remove.value().get() {
        Some(Ok(())) => {
            created.set(None);
            hooks.refetch();
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    let deliveries = Resource::new(
        move || shown.get(),
        |id| async move {
            match id {
                Some(id) => api::get::<Vec<WebhookDelivery>>(paths::webhook_deliveries(&id))
                    .await
                    .map(Some),
                None => Ok(None),
            }
        },
    );
    let all: Vec<String> = WEBHOOK_EVENTS.iter().map(|e| (*e).to_owned()).collect();
    view! {
        <section class="card" data-testid="webhooks">
            <h2>"Webhooks"</h2>
            <p class="muted">"The organization's events, sent as signed JSON (header "<code>"X-Autodl-Signature: t=…,v1=…"</code>", HMAC-SHA256 of "<code>"t.body"</code>" under the webhook's secret) and tried again until taken."</p>
            <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <table class="table" data-testid="webhook-list">
                <thead><tr><th>"URL"</th><th>"Events"</th><th>"Added"</th><th></th></tr></thead>
                <tbody>
                {move || match hooks.get() {
                    None => view! { <tr><td colspan="4" class="muted">"Loading…"</td></tr> }.into_any(),
                    Some(Err(e)) => view! { <tr><td colspan="4" class="error">{e.message}</td></tr> }.into_any(),
                    Some(Ok(list)) if list.is_empty() => view! { <tr><td colspan="4" class="muted">"No webhooks yet."</td></tr> }.into_any(),
                    Some(Ok(list)) => list.into_iter().map(|w| {
                        let (id, id2) = (w.id.clone(), w.id.clone());
                        view! {
                            <tr data-webhook=w.id.clone()>
                                <td data-label="URL"><code>{w.url.clone()}</code></td>
                                <td data-label="Events">{w.events.join(", ")}</td>
                                <td data-label="Added"><Time at=w.created_at.clone()/>" by "{w.created_by.clone()}</td>
                                <td class="row-actions">
                                    <button type="button" class="small secondary" data-testid="webhook-deliveries" on:click=move |_| shown.set(Some(id.clone()))>"Deliveries"</button>
                                    <button type="button" class="small danger" on:click=move |_| {
                                        if crate::live::confirm("Remove this webhook? Its pending deliveries are dropped.") { remove.dispatch(id2.clone()); }
                                    }>"Remove"</button>
                                </td>
                            </tr>
                        }
                    }).collect_view().into_any(),
                }}
                </tbody>
            </table>
            {move || deliveries.get().and_then(|r| r.ok()).flatten().map(|list| view! {
                <h3>"Latest deliveries"</h3>
                <table class="table" data-testid="webhook-delivery-list">
                    <thead><tr><th>"Event"</th><th>"Status"</th><th>"Tries"</th><th>"Queued"</th><th>"Last error"</th></tr></thead>
                    <tbody>
                        {if list.is_empty() {
                            view! { <tr><td colspan="5" class="muted">"Nothing sent yet."</td></tr> }.into_any()
                        } else {
                            list.into_iter().map(|d| view! {
                                <tr>
                                    <td>{d.event.clone()}</td>
                                    <td><span class="badge">{d.status.clone()}</span></td>
                                    <td>{d.attempts}</td>
                                    <td><Time at=d.created_at.clone()/></td>
                                    <td class="small">{d.last_error.clone().unwrap_or_default()}</td>
                                </tr>
                            }).collect_view().into_any()
                        }}
                    </tbody>
                </table>
            })}
            </Transition>
            <h3>"Add a webhook"</h3>
            <form class="stack" on:submit=move |ev| {
                ev.prevent_default();
                add.dispatch(WebhookInput { url: url.get_untracked(), events: chosen.get_untracked() });
            }>
                <div class="field">
                    <label for="webhook-url">"URL"</label>
                    <input id="webhook-url" type="url" placeholder="https://hooks.example.com/autodl" data-testid="webhook-url"
                        prop:value=url on:input=move |ev| url.set(event_target_value(&ev))/>
                </div>
                {event_boxes("webhook", all, vec!["task.failed".to_owned()], chosen, true)}
                <div><button type="submit" data-testid="webhook-add">"Add webhook"</button></div>
            </form>
            <p class="banner error" role="alert">{move || general_error(error.get(), &[])}</p>
            {move || created.get().and_then(|w| w.secret).map(|secret| view! {
                <div class="banner ok" data-testid="webhook-secret">
                    "Added. Its signing secret, shown this once: " <code>{secret}</code>
                </div>
            })}
        </section>
    }
}
