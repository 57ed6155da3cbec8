use autodl_common::api::{
    CreateInvitationRequest, Invitation, Member, Quota, Role, SessionPolicy, TenantInfo,
    UpdateMemberRequest,
};
use leptos::prelude::*;

use super::quota::{quota_summary, QuotaEditor};
use crate::api::{self, ApiErr};
use crate::fields::{general_error, Field};
use crate::form::{invalid, opt_num};
use crate::paths;
use crate::session::{use_session, RequireLogin};
use crate::time::Time;

#[component]
pub fn OrgPage() -> impl IntoView {
    view! { <RequireLogin><Org/></RequireLogin> }
}

#[component]
fn Org() -> impl IntoView {
    let session = use_session();
    let manager = move || session.me().is_some_and(|m| m.role.can_manage());
    // How people sign in is the owners' to decide.
    let owner = move || {
        session
            .me()
            .is_some_and(|m| m.role == autodl_common::api::Role::Owner || m.platform_admin)
    };
    let tenant = Resource::new(|| (), |_| api::get::<TenantInfo>(paths::tenant()));
    let quota = Resource::new(|| (), |_| api::get::<Quota>(paths::tenant_quota()));
    let members = Resource::new(|| (), |_| api::get::<Vec<Member>>(paths::members()));
    let error = RwSignal::new(None::<ApiErr>);
    let editing = RwSignal::new(None::<(String, String)>);

    let set_role = Action::new_local(move |(id, role): &(String, Role)| {
        let (id, role) = (id.clone(), *role);
        async move {
            api::patch::<_, Member>(paths::member(&id), &UpdateMemberRequest { role })
                .await
                .map(|_| ())
        }
    });
    let remove = Action::new_local(move |id: &String| {
        let id = id.clone();
        async move { api::delete(paths::member(&id)).await }
    });
    for result in [set_role.value(), remove.value()] {
        Effect::new(move |_| match result.get() {
            Some(Ok(())) => {
                error.set(None);
                members.refetch();
            }
            Some(Err(e)) => error.set(Some(e)),
            None => {}
        });
    }

    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <h1>{move || tenant.get().and_then(|t| t.ok()).map(|t| t.name).unwrap_or_else(|| "Organization".into())}</h1>
            <p class="muted">"Organization quota: "
                <span data-testid="tenant-quota">{move || quota.get().and_then(|q| q.ok()).map(|q| quota_summary(&q))}</span>
            </p>
            <p class="banner error" role="alert">{move || general_error(error.get(), &[])}</p>
            <table class="table" data-testid="members">
                <thead><tr><th>"Member"</th><th>"Role"</th><th>"Joined"</th><th></th></tr></thead>
                <tbody>
                {move || match members.get() {
                    None => view! { <tr><td colspan="4" class="muted">"Loading…"</td></tr> }.into_any(),
                    Some(Err(e)) => view! { <tr><td colspan="4" class="error">{e.message}</td></tr> }.into_any(),
                    Some(Ok(list)) => list.into_iter().map(|m| {
                        let id = m.id.clone();
                        let id2 = m.id.clone();
                        let id3 = m.id.clone();
                        let email = m.email.clone();
                        let role = m.role;
                        let is_me = session.me().is_some_and(|me| me.id == m.id);
                        view! {
                            <tr class:disabled=m.disabled>
                                <td>{m.email.clone()}{m.disabled.then_some(" (removed)")}</td>
                                <td>
                                    {move || if manager() && !m.disabled {
                                        let id = id.clone();
                                        view! {
                                            <select aria-label="Role" on:change=move |ev| {
                                                if let Some(r) = Role::parse(&event_target_value(&ev)) {
                                                    set_role.dispatch((id.clone(), r));
                                                }
                                            }>
                                                {[Role::Owner, Role::Admin, Role::Member].into_iter().map(|r| view! {
                                                    <option value=r.as_str() selected=r == role>{r.as_str()}</option>
                                                }).collect_view()}
                                            </select>
                                        }.into_any()
                                    } else {
                                        view! { <span class="badge">{role.as_str()}</span> }.into_any()
                                    }}
                                </td>
                                <td><Time at=m.created_at.clone()/></td>
                                <td class="row-actions">
                                    <Show when=manager>
                                        {
                                            let (id2, email) = (id2.clone(), email.clone());
                                            view! { <button type="button" class="small secondary" on:click=move |_| editing.set(Some((id2.clone(), email.clone())))>"Quota"</button> }
                                        }
                                        {
                                            let id3 = id3.clone();
                                            (!is_me).then(|| view! { <button type="button" class="small danger" on:click=move |_| {
                                                if crate::live::confirm("Remove this member? They lose access to the organization and its tasks.") { remove.dispatch(id3.clone()); }
                                            }>"Remove"</button> })
                                        }
                                    </Show>
                                </td>
                            </tr>
                        }
                    }).collect_view().into_any(),
                }}
                </tbody>
            </table>
        </section>
        </Transition>
        {move || editing.get().map(|(id, email)| view! { <MemberQuota id email on_close=move || editing.set(None)/> })}
        <Show when=manager><Invitations/></Show>
        <Show when=manager><SessionRules/></Show>
        <Show when=manager><super::notifications::Webhooks/></Show>
        <Show when=owner><super::sso::SsoSettingsForm organization=true/></Show>
    }
}

#[component]
fn MemberQuota(
    id: String,
    email: String,
    on_close: impl Fn() + Clone + Send + Sync + 'static,
) -> impl IntoView {
    let path = paths::member_quota(&id);
    let path2 = path.clone();
    let current = Resource::new(
        move || path.clone(),
        |p| async move { api::get::<Quota>(&p).await },
    );
    let save = move |q: Quota| {
        let p = path2.clone();
        async move { api::put::<_, Quota>(&p, &q).await }
    };
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <h2>"Quota for " {email}</h2>
            <p class="muted">"Each cap must stay within the organization's. Empty means no cap of its own."</p>
            {move || current.get().map(|q| match q {
                Ok(q) => view! { <QuotaEditor initial=q save=save.clone() on_close=on_close.clone()/> }.into_any(),
                Err(e) => view! { <p class="error">{e.message}</p> }.into_any(),
            })}
        </section>
        </Transition>
    }
}

#[component]
fn Invitations() -> impl IntoView {
    let list = Resource::new(|| (), |_| api::get::<Vec<Invitation>>(paths::invitations()));
    let email = RwSignal::new(String::new());
    let role = RwSignal::new("member".to_string());
    let error = RwSignal::new(None::<ApiErr>);
    let created = RwSignal::new(None::<Invitation>);
    let create = Action::new_local(move |req: &CreateInvitationRequest| {
        let req = req.clone();
        async move { api::post::<_, Invitation>(paths::invitations(), &req).await }
    });
    Effect::new(move |_| match create.value().get() {
        Some(Ok(inv)) => {
            created.set(Some(inv));
            email.set(String::new());
            error.set(None);
            list.refetch();
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    let revoke = Action::new_local(move |id: &String| {
        let id = id.clone();
        async move { api::delete(paths::invitation(&id)).await }
    });
    Effect::new(move |_| {
        if revoke.value().get().is_some() {
            list.refetch();
        }
    });
    let on_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        create.dispatch(CreateInvitationRequest {
            email: email.get_untracked(),
            role: Role::parse(&role.get_untracked()).unwrap_or(Role::Member),
        });
    };
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <h2>"Invitations"</h2>
            {move || created.get().and_then(|i| i.link).map(|link| view! {
                <div class="notice" data-testid="invite-link">
                    <p>"Send this link to the invitee; it is shown once:"</p>
                    <code>{link}</code>
                </div>
            })}
            <form class="inline-form" method="post" on:submit=on_submit novalidate>
                <Field label="Email" id="invite-email" kind="email" value=email
                    error=Signal::derive(move || error.get().and_then(|e| e.for_field("email")))/>
                <div class="field">
                    <label for="invite-role">"Role"</label>
                    <select id="invite-role" bind:value=role>
                        <option value="member">"member"</option>
                        <option value="admin">"admin"</option>
                        <option value="owner">"owner"</option>
                    </select>
                </div>
                <button type="submit">"Invite"</button>
            </form>
            <p class="banner error" role="alert">{move || general_error(error.get(), &["email"])}</p>
            <table class="table">
                <thead><tr><th>"Email"</th><th>"Role"</th><th>"Expires"</th><th>"Status"</th><th></th></tr></thead>
                <tbody>
                {move || list.get().and_then(|l| l.ok()).unwrap_or_default().into_iter().map(|i| {
                    let id = i.id.clone();
                    view! {
                        <tr>
                            <td>{i.email}</td><td>{i.role.as_str()}</td><td><Time at=i.expires_at.clone()/></td>
                            <td>{if i.accepted { "accepted" } else { "pending" }}</td>
                            <td>{(!i.accepted).then(|| view! {
                                <button type="button" class="small danger" on:click=move |_| {
                                    if crate::live::confirm("Revoke this invitation?") { revoke.dispatch(id.clone()); }
                                }>"Revoke"</button>
                            })}</td>
                        </tr>
                    }
                }).collect_view()}
                </tbody>
            </table>
        </section>
        </Transition>
    }
}

/// The organization's rules for sessions and idle GPUs: what counts as idle, how long before
/// a session is stopped, whether batch tasks are stopped too, and the caps on sessions.
#[component]
fn SessionRules() -> impl IntoView {
    let current = Resource::new(
        || (),
        |_| api::get::<SessionPolicy>(paths::session_policy()),
    );
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card" data-testid="session-policy">
            <h2>"Sessions and idle GPUs"</h2>
            <p class="muted">"A task whose GPUs stay under the threshold, with nobody connected to it, is warned at half the idle time and a session is stopped at the whole (through its grace period, so it can checkpoint). 0 minutes turns idle stopping off."</p>
            {move || current.get().map(|p| match p {
                Ok(p) => view! { <SessionRulesForm initial=p/> }.into_any(),
                Err(e) => view! { <p class="error">{e.message}</p> }.into_any(),
            })}
        </section>
        </Transition>
    }
}

#[component]
fn SessionRulesForm(initial: SessionPolicy) -> impl IntoView {
    let util = RwSignal::new(initial.idle_util_pct.to_string());
    let minutes = RwSignal::new(initial.idle_minutes.to_string());
    let hours = RwSignal::new(
        initial
            .max_session_hours
            .map(|h| h.to_string())
            .unwrap_or_default(),
    );
    let count = RwSignal::new(
        initial
            .max_sessions_per_user
            .map(|n| n.to_string())
            .unwrap_or_default(),
    );
    let stop_batch = RwSignal::new(initial.stop_idle_batch);
    let error = RwSignal::new(None::<ApiErr>);
    let saved = RwSignal::new(false);
    let save = Action::new_local(move |p: &SessionPolicy| {
        let p = p.clone();
        async move { api::put::<_, SessionPolicy>(paths::session_policy(), &p).await }
    });
    Effect::new(move |_| match save.value().get() {
        Some(Ok(_)) => {
            error.set(None);
            saved.set(true);
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    let on_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        saved.set(false);
        let policy = (|| -> Result<SessionPolicy, ApiErr> {
            Ok(SessionPolicy {
                idle_util_pct: opt_num(&util.get_untracked(), "idle_util_pct", "The threshold")?
                    .ok_or_else(|| invalid("idle_util_pct", "The threshold must be a number"))?,
                idle_minutes: opt_num(&minutes.get_untracked(), "idle_minutes", "Idle minutes")?
                    .ok_or_else(|| invalid("idle_minutes", "Idle minutes must be a number"))?,
                stop_idle_batch: stop_batch.get_untracked(),
                max_session_hours: opt_num(
                    &hours.get_untracked(),
                    "max_session_hours",
                    "The longest session",
                )?,
                max_sessions_per_user: opt_num(
                    &count.get_untracked(),
                    "max_sessions_per_user",
                    "Sessions per member",
                )?,
            })
        })();
        match policy {
            Ok(p) => {
                save.dispatch(p);
            }
            Err(e) => error.set(Some(e)),
        }
    };
    let ferr =
        move |f: &'static str| Signal::derive(move || error.get().and_then(|e| e.for_field(f)));
    view! {
        <form class="quota-form" method="post" on:submit=on_submit novalidate>
            <Field label="Idle under (% GPU utilization)" id="idle_util_pct" kind="number" value=util error=ferr("idle_util_pct")/>
            <Field label="Stop after (minutes idle)" id="idle_minutes" kind="number" value=minutes error=ferr("idle_minutes")/>
            <Field label="Longest session (hours)" id="max_session_hours" kind="number" value=hours error=ferr("max_session_hours") placeholder="no cap"/>
            <Field label="Sessions per member at once" id="max_sessions_per_user" kind="number" value=count error=ferr("max_sessions_per_user") placeholder="no cap"/>
            <label class="check"><input type="checkbox" id="stop_idle_batch" data-testid="stop-idle-batch" bind:checked=stop_batch/>" Stop idle batch tasks too (otherwise they are only warned)"</label>
            <p class="banner error" role="alert">{move || general_error(error.get(), &["idle_util_pct", "idle_minutes", "max_session_hours", "max_sessions_per_user"])}</p>
            {move || saved.get().then(|| view! { <p class="banner ok">"Saved."</p> })}
            <div class="actions">
                <button type="submit" data-testid="save-session-policy" disabled=move || save.pending().get()>"Save rules"</button>
            </div>
        </form>
    }
}
