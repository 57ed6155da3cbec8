use autodl_common::agent::{CreateRegistrationToken, RegistrationToken};
use autodl_common::api::{
    AdminTenant, AdminUpdateTenantRequest, AdminUpdateUserRequest, AdminUser, Quota,
    SchedulingPolicy,
};
use autodl_common::tasks::NodeInfo;
use leptos::prelude::*;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};

use super::quota::{quota_summary, QuotaEditor};
use crate::api::{self, ApiErr};
use crate::fields::{general_error, Field};
use crate::live;
use crate::paths;
use crate::session::{use_session, RequireLogin};
use crate::time::Time;

/// The administration tabs: (URL key, label). Each is a link, so a tab can be bookmarked and
/// works without JavaScript.
const TABS: [(&str, &str); 7] = [
    ("organizations", "Organizations"),
    ("users", "Users"),
    ("nodes", "Nodes"),
    ("usage", "Usage"),
    ("tokens", "Agent tokens"),
    ("policy", "Policy"),
    ("sso", "Single sign-on"),
];

/// Rows per page of the organization and user lists.
const PAGE_ROWS: usize = 25;

/// The tab, search and page in the admin page's URL.
#[derive(Debug, Clone, PartialEq)]
struct AdminQuery {
    tab: String,
    search: String,
    page: usize,
}

fn admin_query() -> Memo<AdminQuery> {
    let q = use_query_map();
    Memo::new(move |_| {
        q.with(|q| AdminQuery {
            tab: q
                .get("tab")
                .filter(|t| TABS.iter().any(|(k, _)| k == t))
                .unwrap_or_else(|| TABS[0].0.to_owned()),
            search: q.get("q").unwrap_or_default(),
            page: q.get("page").and_then(|p| p.parse().ok()).unwrap_or(0),
        })
    })
}

/// The rows of this page among those matching the search, and how many match.
fn page_of<T>(rows: Vec<T>, matches: impl Fn(&T) -> bool, page: usize) -> (Vec<T>, usize) {
    let found: Vec<T> = rows.into_iter().filter(|r| matches(r)).collect();
    let total = found.len();
    (
        found
            .into_iter()
            .skip(page * PAGE_ROWS)
            .take(PAGE_ROWS)
            .collect(),
        total,
    )
}

/// A search box (a plain GET form) and page links for a list of `total` matching rows.
#[component]
fn SearchPager(#[prop(into)] total: Signal<usize>, placeholder: &'static str) -> impl IntoView {
    let query = admin_query();
    let link = move |page: usize| {
        let q = query.get();
        let mut url = format!("/admin?tab={}", q.tab);
        if !q.search.is_empty() {
            url.push_str(&format!("&q={}", super::tasks::encode(&q.search)));
        }
        if page > 0 {
            url.push_str(&format!("&page={page}"));
        }
        url
    };
    view! {
        <form class="filters" method="get" action="/admin" role="search">
            // The attribute too: without JavaScript the form sends what the server wrote.
            <input type="hidden" name="tab" value=query.get_untracked().tab prop:value=move || query.get().tab/>
            <div class="field">
                <label for="admin-search">"Search"</label>
                <input id="admin-search" name="q" type="search" data-testid="admin-search" placeholder=placeholder
                    value=query.get_untracked().search prop:value=move || query.get().search/>
            </div>
            <button type="submit" class="small secondary">"Search"</button>
        </form>
        <nav class="pager" aria-label="Pages">
            <span class="muted small" data-testid="admin-count">{move || {
                let (n, page) = (total.get(), query.get().page);
                if n <= PAGE_ROWS { format!("{n} found") } else {
                    format!("{}–{} of {n}", page * PAGE_ROWS + 1, ((page + 1) * PAGE_ROWS).min(n))
                }
            }}</span>
            {move || (query.get().page > 0).then(|| view! { <a class="button secondary small" href=link(query.get().page - 1)>"← Previous"</a> })}
            {move || ((query.get().page + 1) * PAGE_ROWS < total.get()).then(|| view! { <a class="button secondary small" data-testid="admin-next" href=link(query.get().page + 1)>"Next →"</a> })}
        </nav>
    }
}

#[component]
pub fn AdminPage() -> impl IntoView {
    let session = use_session();
    let query = admin_query();
    view! {
        <RequireLogin>
            {move || if session.me().is_some_and(|m| m.platform_admin) {
                view! {
                    <h1>"Administration"</h1>
                    <nav class="tabs" aria-label="Administration" data-testid="admin-tabs">
                        {TABS.into_iter().map(|(key, label)| view! {
                            <a href=format!("/admin?tab={key}") data-testid=format!("tab-{key}")
                                aria-current=move || (query.get().tab == key).then_some("page")>{label}</a>
                        }).collect_view()}
                    </nav>
                    {move || match query.get().tab.as_str() {
                        "users" => view! { <Users/> }.into_any(),
                        "nodes" => view! { <Nodes/> }.into_any(),
                        "usage" => view! { <Usage/> }.into_any(),
                        "tokens" => view! { <RegistrationTokens/> }.into_any(),
                        "policy" => view! { <Policy/> }.into_any(),
                        "sso" => view! { <super::sso::SsoSettingsForm organization=false/> }.into_any(),
                        _ => view! { <Tenants/> }.into_any(),
                    }}
                }.into_any()
            } else {
                view! { <section class="card"><h1>"Administration"</h1><p>"This page is for platform administrators."</p></section> }.into_any()
            }}
        </RequireLogin>
    }
}

#[component]
fn Tenants() -> impl IntoView {
    let tenants = Resource::new(
        || (),
        |_| api::get::<Vec<AdminTenant>>(paths::admin_tenants()),
    );
    let editing = RwSignal::new(None::<AdminTenant>);
    let error = RwSignal::new(None::<ApiErr>);
    let query = admin_query();
    let tenant_total = Signal::derive(move || {
        let needle = query.get().search.to_lowercase();
        tenants.with(|t| {
            t.as_ref().and_then(|r| r.as_ref().ok()).map_or(0, |l| {
                l.iter()
                    .filter(|t| t.name.to_lowercase().contains(&needle))
                    .count()
            })
        })
    });
    let trust = Action::new_local(move |(id, trusted): &(String, bool)| {
        let path = paths::admin_tenant(id);
        let req = AdminUpdateTenantRequest {
            trusted: Some(*trusted),
        };
        async move { api::patch::<_, AdminTenant>(&path, &req).await }
    });
    Effect::new(move |_| match trust.value().get() {
        Some(Ok(_)) => {
            error.set(None);
            tenants.refetch();
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <h2>"Organizations"</h2>
            <p class="muted">"Trusted organizations may also run tasks on trusted-only nodes, which cannot isolate tasks from each other."</p>
            <p class="banner error" role="alert">{move || general_error(error.get(), &[])}</p>
            <table class="table" data-testid="admin-tenants">
                <thead><tr><th>"Name"</th><th>"Members"</th><th>"Quota"</th><th>"Storage"</th><th>"Trusted"</th><th>"Created"</th><th></th></tr></thead>
                <tbody>
                {move || match tenants.get() {
                    None => view! { <tr><td colspan="7" class="muted">"Loading…"</td></tr> }.into_any(),
                    Some(Err(e)) => view! { <tr><td colspan="7" class="error">{e.message}</td></tr> }.into_any(),
                    Some(Ok(list)) => {
                        let q = query.get();
                        let needle = q.search.to_lowercase();
                        let (rows, _) = page_of(list, |t: &AdminTenant| t.name.to_lowercase().contains(&needle), q.page);
                        rows.into_iter().map(|t| {
                        let t2 = t.clone();
                        let (id, trusted, name) = (t.id.clone(), t.trusted, t.name.clone());
                        view! {
                            <tr data-tenant=name>
                                <td>{t.name}</td><td>{t.members}</td><td>{quota_summary(&t.quota)}</td>
                                <td>{super::tasks::bytes(t.storage_bytes)}</td>
                                <td>{if trusted { "yes" } else { "no" }}</td>
                                <td><Time at=t.created_at.clone()/></td>
                                <td class="row-actions">
                                    <button type="button" class="small secondary" on:click=move |_| editing.set(Some(t2.clone()))>"Edit quota"</button>
                                    <button type="button" class="small secondary" data-testid="toggle-trust" on:click=move |_| { trust.dispatch((id.clone(), !trusted)); }>
                                        {if trusted { "Withdraw trust" } else { "Trust" }}
                                    </button>
                                </td>
                            </tr>
                        }
                    }).collect_view().into_any()
                    }
                }}
                </tbody>
            </table>
            <SearchPager total=tenant_total placeholder="organization name"/>
        </section>
        {move || editing.get().map(|t| {
            let path = paths::admin_tenant_quota(&t.id);
            // The table shows the new quota as soon as it is saved, not at the next reload.
            let save = move |q: Quota| {
                let p = path.clone();
                async move {
                    let saved = api::put::<_, Quota>(&p, &q).await;
                    if saved.is_ok() {
                        tenants.refetch();
                    }
                    saved
                }
            };
            view! {
                <section class="card">
                    <h2>"Quota for " {t.name.clone()}</h2>
                    <QuotaEditor initial=t.quota.clone() save storage=true on_close=move || { editing.set(None); tenants.refetch(); }/>
                </section>
            }
        })}
        </Transition>
    }
}

/// Flattens the policy into `weights.fair_share = 1` lines, in the order the server gives.
fn policy_rows(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                policy_rows(&key, v, out);
            }
        }
        other => out.push((prefix.to_owned(), other.to_string())),
    }
}

/// The scheduling policy in force, so an operator sees what the configuration set.
#[component]
fn Policy() -> impl IntoView {
    let policy = Resource::new(
        || (),
        |_| api::get::<SchedulingPolicy>(paths::admin_policy()),
    );
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <h2>"Scheduling policy"</h2>
            {move || policy.get().map(|p| match p {
                Err(e) => view! { <p class="banner error" role="alert">{e.message}</p> }.into_any(),
                Ok(p) => {
                    let mut rows = Vec::new();
                    policy_rows("", &p.policy, &mut rows);
                    view! {
                        <p class="muted">"Set in the server's configuration ([policy]); applies " {p.applies.clone()}</p>
                        <table class="table compact" data-testid="admin-policy">
                            <tbody>
                            {rows.into_iter().map(|(k, v)| view! { <tr><td><code>{k}</code></td><td>{v}</td></tr> }).collect_view()}
                            </tbody>
                        </table>
                    }.into_any()
                }
            })}
        </section>
        </Transition>
    }
}

#[component]
fn Users() -> impl IntoView {
    let users = Resource::new(|| (), |_| api::get::<Vec<AdminUser>>(paths::admin_users()));
    let error = RwSignal::new(None::<ApiErr>);
    let query = admin_query();
    let matches = |u: &AdminUser, needle: &str| {
        u.email.to_lowercase().contains(needle) || u.tenant_name.to_lowercase().contains(needle)
    };
    let user_total = Signal::derive(move || {
        let needle = query.get().search.to_lowercase();
        users.with(|u| {
            u.as_ref()
                .and_then(|r| r.as_ref().ok())
                .map_or(0, |l| l.iter().filter(|u| matches(u, &needle)).count())
        })
    });
    let update = Action::new_local(move |(id, req): &(String, AdminUpdateUserRequest)| {
        let (id, req) = (id.clone(), req.clone());
        async move { api::patch::<_, AdminUser>(paths::admin_user(&id), &req).await }
    });
    Effect::new(move |_| match update.value().get() {
        Some(Ok(_)) => {
            error.set(None);
            users.refetch();
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <h2>"Users"</h2>
            <p class="banner error" role="alert">{move || general_error(error.get(), &[])}</p>
            <SearchPager total=user_total placeholder="email or organization"/>
            <table class="table" data-testid="admin-users">
                <thead><tr><th>"Email"</th><th>"Organization"</th><th>"Role"</th><th>"Status"</th><th></th></tr></thead>
                <tbody>
                {move || {
                    let q = query.get();
                    let needle = q.search.to_lowercase();
                    let all = users.get().and_then(|u| u.ok()).unwrap_or_default();
                    page_of(all, |u| matches(u, &needle), q.page).0
                }.into_iter().map(|u| {
                    let id = u.id.clone();
                    let id2 = u.id.clone();
                    let disabled = u.disabled;
                    let admin = u.platform_admin;
                    // No one locks themselves out from here.
                    let me = use_session().me().is_some_and(|m| m.id == u.id);
                    let who = u.email.clone();
                    let who2 = u.email.clone();
                    view! {
                        <tr class:disabled=disabled>
                            <td>{u.email}</td><td>{u.tenant_name}</td>
                            <td>{u.role.as_str()}{admin.then_some(" · platform admin")}</td>
                            <td>{if disabled { "disabled" } else { "active" }}</td>
                            <td class="row-actions">
                                {(!me).then(|| view! {
                                <button type="button" class="small secondary" on:click=move |_| {
                                    if disabled || crate::live::confirm(&format!("Disable {who}? They are signed out and cannot sign in.")) {
                                        update.dispatch((id.clone(), AdminUpdateUserRequest { disabled: Some(!disabled), platform_admin: None }));
                                    }
                                }>{if disabled { "Enable" } else { "Disable" }}</button>
                                <button type="button" class="small secondary" on:click=move |_| {
                                    if !admin || crate::live::confirm(&format!("Revoke {who2}'s platform admin rights?")) {
                                        update.dispatch((id2.clone(), AdminUpdateUserRequest { disabled: None, platform_admin: Some(!admin) }));
                                    }
                                }>{if admin { "Revoke admin" } else { "Make admin" }}</button>
                                })}
                            </td>
                        </tr>
                    }
                }).collect_view()}
                </tbody>
            </table>
        </section>
        </Transition>
    }
}

#[component]
fn Nodes() -> impl IntoView {
    let nodes = Resource::new(|| (), |_| api::get::<Vec<NodeInfo>>(paths::nodes()));
    let error = RwSignal::new(None::<ApiErr>);
    let act = Action::new_local(move |(id, action): &(String, &'static str)| {
        let path = paths::node_action(id, action);
        async move { api::post_empty(&path).await }
    });
    Effect::new(move |_| match act.value().get() {
        Some(Ok(())) => {
            error.set(None);
            nodes.refetch();
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <h2>"Nodes"</h2>
            <p class="banner error" role="alert">{move || general_error(error.get(), &[])}</p>
            <table class="table" data-testid="admin-nodes">
                <thead><tr><th>"Node"</th><th>"Zone"</th><th>"GPUs"</th><th>"Runs tasks as"</th><th>"Status"</th><th></th></tr></thead>
                <tbody>
                {move || nodes.get().and_then(|n| n.ok()).unwrap_or_default().into_iter().map(|n| {
                    let gpus = {
                        let mut types: Vec<String> = n.gpus.iter().map(|g| g.gpu_type.clone()).collect();
                        types.dedup();
                        format!("{} × {}", n.gpus.len(), types.join(", "))
                    };
                    let busy = n.gpus.iter().filter(|g| !g.tasks.is_empty() || g.other_tasks > 0).count();
                    let (id1, id2, id3, id4) = (n.id.clone(), n.id.clone(), n.id.clone(), n.id.clone());
                    let unisolated = n.isolation == "none";
                    let trusted_only = n.trusted_only;
                    let schedulable = n.schedulable;
                    let how = isolation_text(&n.runtime, &n.isolation);
                    view! {
                        <tr data-node=n.id.clone()>
                            <td>{n.id.clone()}</td>
                            <td>{n.zone.clone()}</td>
                            <td>{gpus}" · "{busy}" busy"</td>
                            <td data-testid="node-isolation">
                                {how}
                                {trusted_only.then(|| view! { " " <span class="badge warn">"trusted-only"</span> })}
                                {(unisolated && !trusted_only).then(|| view! { " " <span class="badge warn">"open to all, unisolated"</span> })}
                                {(!n.limits.is_empty()).then(|| view! { <div class="muted small" data-testid="node-limits">"Limits: "{n.limits.clone()}</div> })}
                                {(!n.network.is_empty()).then(|| view! { <div class="muted small" data-testid="node-network">"Network: "{n.network.clone()}</div> })}
                            </td>
                            <td><span class="badge" data-testid="node-status">{if n.schedulable { "ready" } else { "cordoned" }}</span></td>
                            <td class="row-actions">
                                // Only the action that changes something: a ready node can be
                                // cordoned, a cordoned or drained one made ready again.
                                {if schedulable {
                                    view! { <button type="button" class="small secondary" data-testid="cordon" on:click=move |_| { act.dispatch((id1.clone(), "cordon")); }>"Cordon"</button> }.into_any()
                                } else {
                                    view! { <button type="button" class="small secondary" data-testid="uncordon" on:click=move |_| { act.dispatch((id2.clone(), "uncordon")); }>"Uncordon"</button> }.into_any()
                                }}
                                <button type="button" class="small danger" on:click=move |_| {
                                    if crate::live::confirm(&format!("Drain {}? Its tasks are checkpointed and moved, and it takes no new work.", id3)) { act.dispatch((id3.clone(), "drain")); }
                                }>"Drain"</button>
                                {unisolated.then(|| {
                                    let action = if trusted_only { "open-to-all" } else { "trusted-only" };
                                    view! {
                                        <button type="button" class="small secondary" on:click=move |_| { act.dispatch((id4.clone(), action)); }>
                                            {if trusted_only { "Open to all" } else { "Trusted only" }}
                                        </button>
                                    }
                                })}
                            </td>
                        </tr>
                    }
                }).collect_view()}
                </tbody>
            </table>
        </section>
        </Transition>
    }
}

/// How a node runs tasks, in an administrator's words.
fn isolation_text(runtime: &str, isolation: &str) -> String {
    let runtime = match runtime {
        "docker" => "Docker",
        "process" => "processes (no Docker)",
        "" => "unknown",
        other => other,
    };
    let iso = match isolation {
        "container" => "containers",
        "sandbox" => "own uid, sandboxed",
        "uid" => "own uid, no namespaces",
        "none" => "the agent's user (not isolated)",
        "declared" => "registered by hand",
        other => other,
    };
    format!("{runtime}: {iso}")
}

#[component]
fn RegistrationTokens() -> impl IntoView {
    let tokens = Resource::new(
        || (),
        |_| api::get::<Vec<RegistrationToken>>(paths::registration_tokens()),
    );
    let created = RwSignal::new(None::<RegistrationToken>);
    let error = RwSignal::new(None::<ApiErr>);
    let uses = RwSignal::new("1".to_string());
    let node = RwSignal::new(String::new());
    let create = Action::new_local(move |req: &CreateRegistrationToken| {
        let req = req.clone();
        async move { api::post::<_, RegistrationToken>(paths::registration_tokens(), &req).await }
    });
    Effect::new(move |_| match create.value().get() {
        Some(Ok(t)) => {
            error.set(None);
            created.set(Some(t));
            tokens.refetch();
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    let on_create = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let max_uses = match uses.get_untracked().trim().parse::<u32>() {
            Ok(n) => n,
            Err(_) => {
                error.set(Some(ApiErr {
                    status: 400,
                    code: "validation".into(),
                    message: "nodes must be a whole number".into(),
                    field: Some("max_uses".into()),
                }));
                return;
            }
        };
        let node_id = Some(node.get_untracked().trim().to_string()).filter(|n| !n.is_empty());
        create.dispatch(CreateRegistrationToken {
            name: node_id.clone(),
            expires_in_hours: Some(24),
            max_uses: Some(max_uses),
            node_id,
        });
    };
    let ferr =
        move |f: &'static str| Signal::derive(move || error.get().and_then(|e| e.for_field(f)));
    let revoke = Action::new_local(move |id: &String| {
        let path = paths::registration_token(id);
        async move { api::delete(&path).await }
    });
    Effect::new(move |_| {
        if revoke.value().get().is_some() {
            tokens.refetch();
        }
    });
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <h2>"Agent registration tokens"</h2>
            <p class="muted">"A GPU host joins with " <code>"autodl-agent --server URL --token adlreg_…"</code>
                "; it then authenticates with its own node credential."</p>
            {move || created.get().and_then(|t| t.token).map(|t| view! {
                <div class="notice" data-testid="registration-token"><p><strong>"Copy this token now; it is shown once:"</strong></p><code>{t}</code></div>
            })}
            <p class="muted">"A token lets one node join, unless you allow more. Registering an existing node again (its agent lost its state) needs a token made for that node."</p>
            <form class="token-form" method="post" on:submit=on_create novalidate>
                <Field label="Nodes that may join" id="max_uses" kind="number" value=uses error=ferr("max_uses")/>
                <Field label="For existing node (optional)" id="node_id" value=node error=ferr("node_id") placeholder="any new node"/>
                <button type="submit" disabled=move || create.pending().get()>"New token (24 h)"</button>
            </form>
            <p class="banner error" role="alert">{move || general_error(error.get(), &["max_uses", "node_id"])}</p>
            <table class="table" data-testid="registration-tokens">
                <thead><tr><th>"Name"</th><th>"Used"</th><th>"Node"</th><th>"Created"</th><th>"Expires"</th><th></th></tr></thead>
                <tbody>
                {move || tokens.get().and_then(|t| t.ok()).unwrap_or_default().into_iter().map(|t| {
                    let id = t.id.clone();
                    view! {
                        <tr>
                            <td>{t.name}</td><td>{format!("{} of {}", t.uses, t.max_uses)}</td>
                            <td>{t.node_id.unwrap_or_else(|| "any new node".into())}</td>
                            <td><Time at=t.created_at.clone()/></td><td><Time at=t.expires_at.clone()/></td>
                            <td><button type="button" class="small danger" on:click=move |_| {
                                if crate::live::confirm("Revoke this registration token? Nodes not yet registered with it cannot use it.") { revoke.dispatch(id.clone()); }
                            }>"Revoke"</button></td>
                        </tr>
                    }
                }).collect_view()}
                </tbody>
            </table>
        </section>
        </Transition>
    }
}

/// `GET /api/v1/admin/usage` (the server's `UsageReport`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct UsageReport {
    total_gpu_hours: f64,
    tenants: Vec<TenantUsage>,
    users: Vec<UsageRow>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct TenantUsage {
    tenant_name: String,
    gpu_hours: f64,
    users: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct UsageRow {
    tenant_name: String,
    user_email: String,
    attempts: u64,
    gpu_hours: f64,
    avg_utilization: Option<f64>,
}

#[component]
fn Usage() -> impl IntoView {
    let month = RwSignal::new(live::this_month());
    let report = Resource::new(
        move || month.get(),
        |m| async move {
            if m.is_empty() {
                return Ok(None);
            }
            api::get::<UsageReport>(&format!("{}?month={m}", paths::admin_usage()))
                .await
                .map(Some)
        },
    );
    let csv = move || format!("{}?month={}&format=csv", paths::admin_usage(), month.get());
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <h2>"GPU usage"</h2>
            <div class="usage-form">
                <div class="field">
                    <label for="usage-month">"Month (UTC)"</label>
                    <input id="usage-month" type="month" data-testid="usage-month" bind:value=month/>
                </div>
                <a class="button secondary" data-testid="usage-csv" href=csv download="">"Download CSV"</a>
            </div>
            {move || match report.get() {
                None | Some(Ok(None)) => view! { <p class="muted">"Loading…"</p> }.into_any(),
                Some(Err(e)) => view! { <p class="banner error" role="alert">{e.message}</p> }.into_any(),
                Some(Ok(Some(r))) => view! {
                    <p data-testid="usage-total">"Total: " <strong>{format!("{:.2}", r.total_gpu_hours)}</strong> " GPU-hours"</p>
                    <table class="table" data-testid="usage-tenants">
                        <thead><tr><th>"Organization"</th><th>"Users"</th><th>"GPU-hours"</th></tr></thead>
                        <tbody>
                        {if r.tenants.is_empty() {
                            view! { <tr><td colspan="3" class="muted">"No organization used GPUs this month."</td></tr> }.into_any()
                        } else {
                            r.tenants.into_iter().map(|t| view! {
                                <tr><td>{t.tenant_name}</td><td>{t.users}</td><td>{format!("{:.2}", t.gpu_hours)}</td></tr>
                            }).collect_view().into_any()
                        }}
                        </tbody>
                    </table>
                    <table class="table" data-testid="usage-users">
                        <thead><tr><th>"User"</th><th>"Organization"</th><th>"Attempts"</th><th>"GPU-hours"</th><th>"Mean utilization"</th></tr></thead>
                        <tbody>
                        {if r.users.is_empty() {
                            view! { <tr><td colspan="5" class="muted">"No GPU use this month."</td></tr> }.into_any()
                        } else {
                            r.users.into_iter().map(|u| view! {
                                <tr>
                                    <td>{u.user_email}</td><td>{u.tenant_name}</td><td>{u.attempts}</td>
                                    <td>{format!("{:.2}", u.gpu_hours)}</td>
                                    <td>{u.avg_utilization.map(|v| format!("{:.0}%", v * 100.0)).unwrap_or_else(|| "—".into())}</td>
                                </tr>
                            }).collect_view().into_any()
                        }}
                        </tbody>
                    </table>
                }.into_any(),
            }}
        </section>
        </Transition>
    }
}
