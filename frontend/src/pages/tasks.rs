//! The tasks list (`/tasks`) and one task's page (`/tasks/:id`): state, why it waits, events,
//! attempts, a live log tail and live GPU charts.

use std::time::Duration;

use std::collections::BTreeSet;

use autodl_common::agent::ArtifactFile;
use autodl_common::tasks::{
    AfterWhen, Attempt, Checkpoint, LogLine, PriorityFactors, Task, TaskEvent, TaskPage, TaskSpec,
    TaskState,
};
use leptos::prelude::*;
use leptos_router::hooks::{use_navigate, use_params_map, use_query_map};

use super::compare::MAX_COMPARED;
use super::metrics::{ChartHistory, Metrics};
use crate::api::{self, ApiErr};
use crate::app::{general_error, RequireLogin};
use crate::form::spec_to_input;
use crate::live::{self, TailStatus};
use crate::time::{self, Time};

pub fn state_badge(state: TaskState) -> impl IntoView {
    view! { <span class=format!("badge state-{}", state.as_str()) data-testid="state">{state.as_str()}</span> }
}

/// "2 × A100" style summary of what a task asks for.
pub fn gpu_summary(spec: &TaskSpec) -> String {
    let n = spec.gpus_per_worker * spec.num_workers;
    if n == 0 {
        return "none".into();
    }
    let kind = if spec.gpu_types.is_empty() {
        "any".to_string()
    } else {
        spec.gpu_types.join("/")
    };
    let mem = spec
        .gpu_memory
        .map(|m| format!(" ({} each)", bytes(m)))
        .unwrap_or_default();
    format!("{n} × {kind}{mem}")
}

pub fn bytes(b: u64) -> String {
    const KIB: f64 = 1024.0;
    let v = b as f64;
    if v < KIB {
        format!("{b} B")
    } else if v < KIB * KIB {
        format!("{} KiB", trim_num(v / KIB))
    } else if v < KIB * KIB * KIB {
        format!("{} MiB", trim_num(v / KIB / KIB))
    } else {
        format!("{} GiB", trim_num(v / KIB / KIB / KIB))
    }
}

fn trim_num(v: f64) -> String {
    if (v - v.round()).abs() < 0.05 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[component]
pub fn TasksPage() -> impl IntoView {
    view! { <RequireLogin><TaskList/></RequireLogin> }
}

fn list_path(state: &str, label: &str, mine: bool, cursor: Option<&str>) -> String {
    let mut q = vec!["limit=25".to_string()];
    if !state.is_empty() {
        q.push(format!("state={}", encode(state)));
    }
    if !label.trim().is_empty() {
        q.push(format!("label={}", encode(label.trim())));
    }
    if mine {
        q.push("user=me".into());
    }
    if let Some(c) = cursor {
        q.push(format!("cursor={}", encode(c)));
    }
    format!("/api/v1/tasks?{}", q.join("&"))
}

/// Percent-encodes a query value.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The list's filters and page, as its URL holds them: a filtered list can be shared,
/// reloaded and used without JavaScript (the filters are a plain GET form).
#[derive(Debug, Clone, Default, PartialEq)]
struct ListQuery {
    state: String,
    label: String,
    mine: bool,
    /// Names containing this (on the page shown).
    search: String,
    cursor: Option<String>,
}

impl ListQuery {
    fn url(&self) -> String {
        let mut q = Vec::new();
        if !self.state.is_empty() {
            q.push(format!("state={}", encode(&self.state)));
        }
        if !self.label.trim().is_empty() {
            q.push(format!("label={}", encode(self.label.trim())));
        }
        if self.mine {
            q.push("mine=1".into());
        }
        if !self.search.is_empty() {
            q.push(format!("q={}", encode(&self.search)));
        }
        if let Some(c) = &self.cursor {
            q.push(format!("cursor={}", encode(c)));
        }
        if q.is_empty() {
            "/tasks".into()
        } else {
            format!("/tasks?{}", q.join("&"))
        }
    }
}

#[component]
fn TaskList() -> impl IntoView {
    let params = use_query_map();
    let current = Memo::new(move |_| {
        params.with(|p| ListQuery {
            state: p.get("state").unwrap_or_default(),
            label: p.get("label").unwrap_or_default(),
            mine: p.get("mine").is_some_and(|m| m == "1" || m == "on"),
            search: p.get("q").unwrap_or_default(),
            cursor: p.get("cursor").filter(|c| !c.is_empty()),
        })
    });
    // What is typed, before it is applied; the URL's values again when it changes (Back).
    let first = current.get_untracked();
    let label = RwSignal::new(first.label.clone());
    let search = RwSignal::new(first.search.clone());
    Effect::new(move |_| {
        let q = current.get();
        label.set(q.label);
        search.set(q.search);
    });
    let navigate = use_navigate();
    let go = move |change: &dyn Fn(&mut ListQuery), replace: bool| {
        let mut q = current.get_untracked();
        change(&mut q);
        navigate(
            &q.url(),
            leptos_router::NavigateOptions {
                replace,
                scroll: false,
                ..Default::default()
            },
        );
    };
    let tick = live::ticker(Duration::from_secs(5));
    let tasks = Resource::new(
        move || {
            let q = current.get();
            let path = list_path(&q.state, &q.label, q.mine, q.cursor.as_deref());
            (tick.get(), path)
        },
        |(_, path)| async move { api::get::<TaskPage>(&path).await },
    );
    let (go1, go2, go3, go4, go5) = (go.clone(), go.clone(), go.clone(), go.clone(), go);
    // Rows ticked for a bulk action.
    let selected = RwSignal::new(BTreeSet::<String>::new());
    // The rows on screen: this page of the list, narrowed by the typed search.
    let shown_ids = move || -> Vec<String> {
        let needle = current.get().search.to_lowercase();
        tasks
            .get()
            .and_then(|r| r.ok())
            .map(|p| {
                p.items
                    .into_iter()
                    .filter(|t| named(t, &needle))
                    .map(|t| t.id)
                    .collect()
            })
            .unwrap_or_default()
    };
    let bulk_msg = RwSignal::new(None::<String>);
    let cancel_many = Action::new_local(move |ids: &Vec<String>| {
        let ids = ids.clone();
        async move {
            let mut done = 0;
            let mut failed = Vec::new();
            for id in &ids {
                let path = format!("/api/v1/tasks/{}/cancel", encode(id));
                match api::post::<_, Task>(&path, &serde_json::json!({})).await {
                    Ok(_) => done += 1,
                    Err(e) => failed.push(e.message),
                }
            }
            (done, failed)
        }
    });
    Effect::new(move |_| {
        if let Some((done, failed)) = cancel_many.value().get() {
            let mut msg = format!("Cancelled {done} task{}.", if done == 1 { "" } else { "s" });
            if let Some(first) = failed.first() {
                msg.push_str(&format!(
                    " {} could not be cancelled: {first}",
                    failed.len()
                ));
            }
            bulk_msg.set(Some(msg));
            selected.set(BTreeSet::new());
            tasks.refetch();
        }
    });
    let compare_href = move || {
        let ids: Vec<String> = selected.get().into_iter().collect();
        format!(
            "/compare?ids={}",
            ids.iter().map(|i| encode(i)).collect::<Vec<_>>().join(",")
        )
    };
    let can_compare = move || (2..=MAX_COMPARED).contains(&selected.with(BTreeSet::len));
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <div class="title-row">
                <h1>"Tasks"</h1>
                <a class="button" href="/submit">"Submit a task"</a>
            </div>
            <form class="filters" method="get" action="/tasks" on:submit=move |ev| {
                ev.prevent_default();
                let (l, s) = (label.get_untracked(), search.get_untracked());
                go1(&move |q: &mut ListQuery| { q.label = l.clone(); q.search = s.clone(); q.cursor = None; }, false);
            }>
                <div class="field">
                    <label for="filter-state">"State"</label>
                    <select id="filter-state" name="state" data-testid="filter-state" on:change=move |ev| {
                        let v = event_target_value(&ev);
                        go2(&move |q: &mut ListQuery| { q.state = v.clone(); q.cursor = None; }, false);
                    }>
                        <option value="" selected=move || current.get().state.is_empty()>"all"</option>
                        {TaskState::ALL.into_iter().map(|s| view! {
                            <option value=s.as_str() selected=move || current.get().state == s.as_str()>{s.as_str()}</option>
                        }).collect_view()}
                    </select>
                </div>
                <div class="field">
                    <label for="filter-label">"Label (key=value)"</label>
                    <input id="filter-label" name="label" data-testid="filter-label" placeholder="team=vision"
                        value=first.label prop:value=label on:input=move |ev| label.set(event_target_value(&ev))
                        on:change=move |_| { let l = label.get_untracked(); go3(&move |q: &mut ListQuery| { q.label = l.clone(); q.cursor = None; }, false); }/>
                </div>
                <div class="field">
                    <label for="filter-search">"Search names"</label>
                    <input id="filter-search" name="q" data-testid="filter-search" type="search" placeholder="resnet"
                        value=first.search prop:value=search
                        on:input=move |ev| { let s = event_target_value(&ev); search.set(s.clone()); go4(&move |q: &mut ListQuery| q.search = s.clone(), true); }/>
                </div>
                <label class="check"><input type="checkbox" name="mine" value="1" data-testid="filter-mine" checked=first.mine prop:checked=move || current.get().mine
                    on:change=move |ev| { let m = event_target_checked(&ev); go5(&move |q: &mut ListQuery| { q.mine = m; q.cursor = None; }, false); }/>" Mine only"</label>
                <button type="submit" class="small secondary" data-testid="filter-apply">"Apply"</button>
            </form>
            {move || tasks.get().and_then(|r| r.err()).map(|e| view! { <p class="banner error" role="alert">{e.message}</p> })}
            <p class="muted small" data-testid="task-total">{move || tasks.get().and_then(|r| r.ok()).map(|p| {
                let shown = p.items.len();
                match p.total {
                    1 => "1 task".to_owned(),
                    n => format!("{n} tasks{}", if (n as usize) > shown { format!(", {shown} on this page") } else { String::new() }),
                }
            })}</p>
            <div class="bulk" data-testid="bulk">
                <span class="muted small" data-testid="selected-count">{move || match selected.with(BTreeSet::len) { 0 => "Tick tasks to compare or cancel them together.".to_owned(), n => format!("{n} selected") }}</span>
                {move || if can_compare() {
                    view! { <a class="button secondary small" data-testid="compare" href=compare_href()>"Compare"</a> }.into_any()
                } else {
                    view! { <span class="button secondary small disabled" aria-disabled="true" title=format!("Tick 2 to {MAX_COMPARED} tasks")>"Compare"</span> }.into_any()
                }}
                <button type="button" class="danger small" data-testid="cancel-selected" disabled=move || selected.with(BTreeSet::is_empty) on:click=move |_| {
                    let ids: Vec<String> = selected.get_untracked().into_iter().collect();
                    if crate::live::confirm(&format!("Cancel {} selected task{}? Work since their last checkpoint is lost.", ids.len(), if ids.len() == 1 { "" } else { "s" })) {
                        cancel_many.dispatch(ids);
                    }
                }>"Cancel selected"</button>
                <span class="small" role="status" data-testid="bulk-message">{move || bulk_msg.get()}</span>
            </div>
            <table class="table" data-testid="tasks">
                <thead><tr><th><input type="checkbox" data-testid="select-all" aria-label="Select every task on this page"
                    prop:checked=move || { let ids = shown_ids(); !ids.is_empty() && selected.with(|s| ids.iter().all(|i| s.contains(i))) }
                    on:change=move |ev| {
                        let (on, ids) = (event_target_checked(&ev), shown_ids());
                        selected.update(|s| for id in ids { if on { s.insert(id); } else { s.remove(&id); } });
                    }/></th><th>"Name"</th><th>"State"</th><th>"GPUs"</th><th>"User"</th><th>"Created ↓"</th><th>"Ran for"</th><th>"Waiting"</th></tr></thead>
                <tbody>
                {move || match tasks.get() {
                    None => view! { <tr><td colspan="8" class="muted">"Loading…"</td></tr> }.into_any(),
                    Some(Err(_)) => view! { <tr><td colspan="8" class="muted">"—"</td></tr> }.into_any(),
                    Some(Ok(page)) => {
                        let needle = current.get().search.to_lowercase();
                        let rows: Vec<Task> = page.items.into_iter().filter(|t| named(t, &needle)).collect();
                        if rows.is_empty() {
                            return view! { <tr><td colspan="8" class="muted" data-testid="no-tasks">"No tasks match."</td></tr> }.into_any();
                        }
                        rows.into_iter().map(|t| {
                            let waiting = t.waiting.as_ref().map(|w| w.message.clone()).unwrap_or_default();
                            let (id1, id2) = (t.id.clone(), t.id.clone());
                            view! {
                                <tr data-testid="task-row" data-task=t.id.clone()>
                                    <td><input type="checkbox" data-testid="select-task" aria-label=format!("Select {}", t.name)
                                        prop:checked=move || selected.with(|s| s.contains(&id1))
                                        on:change=move |ev| {
                                            let on = event_target_checked(&ev);
                                            selected.update(|s| { if on { s.insert(id2.clone()); } else { s.remove(&id2); } });
                                        }/></td>
                                    <td data-label="Name"><a href=format!("/tasks/{}", t.id)>{t.name.clone()}</a></td>
                                    <td data-label="State">{state_badge(t.state)}</td>
                                    <td data-label="GPUs">{gpu_summary(&t.spec)}</td>
                                    <td data-label="User">{t.user_email.clone()}</td>
                                    <td data-label="Created"><Time at=t.created_at.clone()/></td>
                                    <td data-label="Ran for">{ran_for(&t).unwrap_or_default()}</td>
                                    <td data-label="Waiting" class="muted small">{waiting}</td>
                                </tr>
                            }
                        }).collect_view().into_any()
                    }
                }}
                </tbody>
            </table>
            // Pages are links: they work without JavaScript, and the browser's back button
            // returns to the newer page.
            <nav class="pager" aria-label="Pages">
                {move || current.get().cursor.is_some().then(|| {
                    let first = ListQuery { cursor: None, ..current.get() }.url();
                    view! { <a class="button secondary small" data-testid="prev-page" href=first>"← Newest"</a> }
                })}
                {move || tasks.get().and_then(|r| r.ok()).and_then(|p| p.next_cursor).map(|next| {
                    let older = ListQuery { cursor: Some(next), ..current.get() }.url();
                    view! { <a class="button secondary small" data-testid="next-page" href=older>"Older →"</a> }
                })}
            </nav>
        </section>
        </Transition>
    }
}

#[component]
pub fn TaskPage() -> impl IntoView {
    view! { <RequireLogin><TaskDetail/></RequireLogin> }
}

#[component]
fn TaskDetail() -> impl IntoView {
    let params = use_params_map();
    let id = Memo::new(move |_| params.with(|p| p.get("id").unwrap_or_default()));
    view! {
        {move || {
            let id = id.get();
            view! { <TaskView id/> }
        }}
    }
}

#[component]
fn TaskView(id: String) -> impl IntoView {
    let tick = live::ticker(Duration::from_secs(2));
    let finished = RwSignal::new(false);
    // As it goes into API paths: an id from the URL is text the visitor chose.
    let tid = StoredValue::new(encode(&id));
    let task = Resource::new(
        move || {
            // Once finished, a task no longer changes: stop polling.
            let tick = if finished.get() { 0 } else { tick.get() };
            (tick, format!("/api/v1/tasks/{}", tid.get_value()))
        },
        |(_, path)| async move { api::get::<Task>(&path).await },
    );
    Effect::new(move |_| {
        if let Some(Ok(t)) = task.get() {
            if t.state.is_finished() && !finished.get_untracked() {
                finished.set(true);
            }
        }
    });
    // Bumped when the task changes after the page was built, so its events, attempts and
    // checkpoints are fetched again. A counter set by an effect, not a memo over the task:
    // resources whose source is another resource would refetch while the server renders.
    let version = RwSignal::new(0u64);
    Effect::new(move |seen: Option<Option<(TaskState, u32, String)>>| {
        let now = task
            .get()
            .and_then(|r| r.ok())
            .map(|t| (t.state, t.attempts, t.updated_at));
        // Only a change after the task was first shown: its first arrival is no change.
        if seen.is_some_and(|seen| seen.is_some() && seen != now) {
            version.update(|v| *v += 1);
        }
        now
    });
    let events = Resource::new(
        move || {
            (
                version.get(),
                format!("/api/v1/tasks/{}/events", tid.get_value()),
            )
        },
        |(_, path)| async move { api::get::<Vec<TaskEvent>>(&path).await },
    );
    let attempts = Resource::new(
        move || {
            (
                version.get(),
                format!("/api/v1/tasks/{}/attempts", tid.get_value()),
            )
        },
        |(_, path)| async move { api::get::<Vec<Attempt>>(&path).await },
    );
    let checkpoints = Resource::new(
        move || {
            (
                version.get(),
                format!("/api/v1/tasks/{}/checkpoints", tid.get_value()),
            )
        },
        |(_, path)| async move { api::get::<Vec<Checkpoint>>(&path).await },
    );
    let history = ChartHistory::new(&id);
    let is_running =
        Memo::new(move |_| matches!(task.get(), Some(Ok(ref t)) if t.state == TaskState::Running));
    let missing = Memo::new(
        move |_| matches!(task.get(), Some(Err(ref e)) if e.status == 404 || e.status == 403),
    );
    let results = Resource::new(
        move || {
            (
                version.get(),
                format!("/api/v1/tasks/{}/results/files", tid.get_value()),
            )
        },
        |(_, path)| async move { api::get::<Vec<ArtifactFile>>(&path).await },
    );
    let error = RwSignal::new(None::<ApiErr>);
    let navigate = use_navigate();
    let cancel = Action::new_local(move |_: &()| {
        let path = format!("/api/v1/tasks/{}/cancel", tid.get_value());
        async move { api::post::<_, Task>(&path, &serde_json::json!({})).await }
    });
    Effect::new(move |_| match cancel.value().get() {
        Some(Ok(_)) => {
            error.set(None);
            task.refetch();
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    let retry = Action::new_local(move |spec: &TaskSpec| {
        let input = spec_to_input(spec);
        async move { api::post::<_, Task>("/api/v1/tasks", &input).await }
    });
    let nav = navigate.clone();
    Effect::new(move |_| match retry.value().get() {
        Some(Ok(t)) => nav(&format!("/tasks/{}", t.id), Default::default()),
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    let results_msg = RwSignal::new(None::<String>);
    let download = Action::new_local(move |_: &()| {
        let path = format!("/api/v1/tasks/{}/results", tid.get_value());
        async move { api::probe(&path).await.map(|_| path) }
    });
    Effect::new(move |_| match download.value().get() {
        Some(Ok(path)) => {
            results_msg.set(None);
            api::go_to(&path);
        }
        Some(Err(e)) => results_msg.set(Some(e.message)),
        None => {}
    });

    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        {move || match task.get() {
            None => view! { <section class="card"><p class="muted">"Loading…"</p></section> }.into_any(),
            Some(Err(e)) => view! { <section class="card"><h1>"Task"</h1><p class="banner error" role="alert">{e.message}</p><p><a href="/tasks">"All tasks"</a></p></section> }.into_any(),
            Some(Ok(t)) => {
                let spec = t.spec.clone();
                let t_for_summary = t.clone();
                let t_for_idle = t.clone();
                let running = !t.state.is_finished();
                let placement = t.placement.clone().unwrap_or_default().iter().map(|p| format!("{} GPU {:?}", p.node, p.gpu_indices)).collect::<Vec<_>>().join(", ");
                view! {
                    <section class="card">
                        <p class="crumbs"><a href="/tasks">"Tasks"</a>" / "</p>
                        <div class="title-row">
                            <h1 data-testid="task-name">{t.name.clone()}" "{state_badge(t.state)}</h1>
                            <div class="actions">
                                {running.then(|| view! {
                                    <button type="button" class="danger" data-testid="cancel" on:click=move |_| {
                                        if crate::live::confirm("Cancel this task? It stops now; work since its last checkpoint is lost.") { cancel.dispatch(()); }
                                    }>"Cancel"</button>
                                })}
                                <a class="button secondary" data-testid="clone" href=format!("/submit?from={}", t.id)>"Clone"</a>
                                // Retrying a task that still runs would run it twice.
                                {(!running).then(|| view! {
                                    <button type="button" class="secondary" data-testid="retry" on:click=move |_| { retry.dispatch(spec.clone()); }>"Retry"</button>
                                })}
                                <button type="button" class="secondary" data-testid="download" on:click=move |_| { download.dispatch(()); }>"Download results"</button>
                            </div>
                        </div>
                        <p class="banner error" role="alert">{move || general_error(error.get(), &[])}</p>
                        <p class="banner error" role="alert" data-testid="results-message">{move || results_msg.get()}</p>
                        {move || {
                            let list = attempts.get().and_then(|r| r.ok()).unwrap_or_default();
                            failure_summary(&t_for_summary, &list).map(|m| {
                                let head = if t_for_summary.state == TaskState::TimedOut { "Timed out. " } else { "Failed. " };
                                view! { <p class="banner error" data-testid="failure-summary"><strong>{head}</strong>{m}</p> }
                            })
                        }}
                        {move || {
                            let list = events.get().and_then(|r| r.ok()).unwrap_or_default();
                            idle_notice(t_for_idle.state, &list).map(|(head, e)| view! {
                                <p class="banner warn" role="status" data-testid="idle-notice">
                                    <strong>{head}</strong>" "<Time at=e.at.clone()/>": "{e.message.clone()}
                                </p>
                            })
                        }}
                        {results_notice(&t).map(|(class, text)| view! {
                            <p class=class role="status" data-testid="results-notice">{text}</p>
                        })}
                        <dl class="facts">
                            <dt>"Submitted"</dt><dd><Time at=t.created_at.clone()/>" by "{t.user_email.clone()}</dd>
                            {t.started_at.clone().map(|at| view! { <dt>"Started"</dt><dd><Time at/></dd> })}
                            {ran_for(&t).map(|d| view! { <dt>"Ran for"</dt><dd data-testid="ran-for">{d}</dd> })}
                            <dt>"GPU time"</dt><dd data-testid="gpu-hours">{gpu_hours(t.gpu_seconds)}</dd>
                            <dt>"Image"</dt><dd><code>{t.spec.image.clone()}</code></dd>
                            <dt>"Command"</dt><dd><code>{t.spec.command.join(" ")}</code></dd>
                            <dt>"GPUs"</dt><dd>{gpu_summary(&t.spec)}</dd>
                            {(!t.spec.ports.is_empty()).then(|| {
                                let running = t.state == TaskState::Running;
                                view! {
                                    <dt>"Ports"</dt>
                                    <dd data-testid="ports">
                                        {t.spec.ports.iter().map(|p| if running {
                                            // On the app's own origin, in a new tab: the server answers
                                            // with where it lives and a ticket in.
                                            let href = format!("/api/v1/tasks/{}/ports/{p}/open", tid.get_value());
                                            view! { <a class="button secondary small" href=href target="_blank" rel="noopener" data-testid="open-port">"Open "{*p}</a>" " }.into_any()
                                        } else {
                                            view! { <code>{*p}</code>" " }.into_any()
                                        }).collect_view()}
                                    </dd>
                                }
                            })}
                            <dt>"Priority"</dt><dd>{format!("{:.2}", t.spec.priority)}</dd>
                            {t.spec.time_limit.map(|l| view! { <dt>"Time limit"</dt><dd data-testid="time-limit">{span_words(l)}</dd> })}
                            {(!t.spec.after.is_empty()).then(|| {
                                let when = match t.spec.after_when { AfterWhen::Ok => "each completed", AfterWhen::Any => "each ended" };
                                view! {
                                    <dt>"Starts after"</dt>
                                    <dd data-testid="after">
                                        {t.spec.after.iter().map(|id| view! { <a href=format!("/tasks/{id}")><code>{id.clone()}</code></a>" " }).collect_view()}
                                        <span class="muted small">{format!("({when})")}</span>
                                    </dd>
                                }
                            })}
                            <dt>"Attempts"</dt><dd>{t.attempts}</dd>
                            {(!placement.is_empty()).then(|| view! { <dt>"Placed on"</dt><dd>{placement.clone()}</dd> })}
                            {(!t.spec.labels.is_empty()).then(|| view! { <dt>"Labels"</dt><dd>{t.spec.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")}</dd> })}
                        </dl>
                    </section>
                    {t.waiting.clone().map(|w| view! {
                        <section class="card" data-testid="waiting">
                            <h2>"Why it waits"</h2>
                            <p>{w.message.clone()}</p>
                            {w.position.map(|p| view! {
                                <p class="muted" data-testid="queue-position">"Position in the queue: " <strong>{p + 1}</strong>
                                    ". The queue is ordered by the total below, highest first, not by declared priority alone: a task whose owner has used less of their fair share lately, or whose deadline is nearer, can go ahead of one submitted earlier."</p>
                            })}
                            <p class="muted" data-testid="estimated-start">"Expected to start: " <strong>{w.estimated_start.as_deref().map_or_else(|| "not estimated yet".to_owned(), time::local)}</strong></p>
                            {w.priority.clone().map(priority_bars)}
                        </section>
                    })}
                }.into_any()
            }
        }}
        // A task that is not there (or not this organization's) has nothing to stream.
        {move || (!missing.get()).then(|| view! {
            <section class="card">
                <h2>"Metrics"</h2>
                <Metrics history/>
            </section>
            <section class="card">
                <h2>"Log"</h2>
                <LogTail id=id.clone()/>
            </section>
        })}
        {move || is_running.get().then(|| view! {
            <section class="card" data-testid="terminal-card">
                <h2>"Terminal"</h2>
                <crate::terminal::TerminalPanel path_id=tid.get_value()/>
            </section>
        })}
        <section class="card">
            <h2>"Attempts"</h2>
            <table class="table" data-testid="attempts">
                <thead><tr><th>"#"</th><th>"Node / GPUs"</th><th>"Started"</th><th>"Ended"</th><th>"Length"</th><th>"Exit"</th><th>"Reason"</th></tr></thead>
                <tbody>
                {move || {
                    let list = attempts.get().and_then(|r| r.ok()).unwrap_or_default();
                    if list.is_empty() {
                        return view! { <tr><td colspan="7" class="muted">"No attempts yet."</td></tr> }.into_any();
                    }
                    list.into_iter().map(|a| {
                        let place = a.placement.iter().map(|p| format!("{} {:?}", p.node, p.gpu_indices)).collect::<Vec<_>>().join(", ");
                        view! {
                            <tr>
                                <td>{a.number}</td>
                                <td>{if place.is_empty() { a.node.clone().unwrap_or_default() } else { place }}</td>
                                <td><Time at=a.started_at.clone()/></td>
                                <td>{match a.ended_at.clone() { Some(at) => view! { <Time at/> }.into_any(), None => "running".into_any() }}</td>
                                <td>{attempt_length(&a)}</td>
                                <td>{a.exit_code.map(|c| c.to_string()).unwrap_or_default()}</td>
                                <td>{exit_reason(a.reason.as_deref(), a.exit_code)}</td>
                            </tr>
                        }
                    }).collect_view().into_any()
                }}
                </tbody>
            </table>
        </section>
        {move || results.get().and_then(|r| r.ok()).filter(|l| !l.is_empty()).map(|files| view! {
            <section class="card">
                <h2>"Results"</h2>
                <table class="table" data-testid="result-files">
                    <thead><tr><th>"File"</th><th>"Size"</th></tr></thead>
                    <tbody>
                        {files.into_iter().map(|f| {
                            let href = format!(
                                "/api/v1/tasks/{}/results/files/{}",
                                tid.get_value(),
                                f.path.split('/').map(encode).collect::<Vec<_>>().join("/")
                            );
                            view! { <tr><td data-label="File"><a href=href download>{f.path.clone()}</a></td><td data-label="Size">{bytes(f.size)}</td></tr> }
                        }).collect_view()}
                    </tbody>
                </table>
            </section>
        })}
        <section class="card">
            <h2>"Checkpoints"</h2>
            <table class="table" data-testid="checkpoints">
                <thead><tr><th>"Saved"</th><th>"Attempt"</th><th>"Step"</th><th>"Files"</th><th>"Size"</th></tr></thead>
                <tbody>
                {move || {
                    let list = checkpoints.get().and_then(|r| r.ok()).unwrap_or_default();
                    if list.is_empty() {
                        return view! { <tr><td colspan="5" class="muted">"No checkpoints saved. Files the task writes to $AUTODL_CHECKPOINT_DIR are saved every checkpoint interval, when it asks (autodl.checkpoint.save_now()) and when it is stopped; the next attempt resumes from the newest."</td></tr> }.into_any();
                    }
                    list.into_iter().map(|c| view! {
                        <tr title=c.location.clone()>
                            <td><Time at=c.created_at.clone()/></td>
                            <td>{c.attempt}</td>
                            <td>{c.step.map(|s| s.to_string()).or_else(|| c.epoch.map(|e| format!("epoch {e}"))).unwrap_or_else(|| "—".into())}</td>
                            <td>{c.files}</td>
                            <td>{bytes(c.size_bytes)}</td>
                        </tr>
                    }).collect_view().into_any()
                }}
                </tbody>
            </table>
        </section>
        <section class="card">
            <h2>"Events"</h2>
            <ol class="timeline" data-testid="events">
                {move || events.get().and_then(|r| r.ok()).unwrap_or_default().into_iter().map(|e| view! {
                    <li><span class="muted"><Time at=e.at.clone() seconds=true/></span>" "<span class="badge">{e.kind.clone()}</span>" "{e.message.clone()}</li>
                }).collect_view()}
            </ol>
        </section>
        </Transition>
    }
}

/// Whether a task's name holds the (lower-cased) search typed over the list.
fn named(t: &Task, needle: &str) -> bool {
    needle.is_empty() || t.name.to_lowercase().contains(needle)
}

/// How long the task has run: from its first start to its end (or now).
pub fn ran_for(t: &Task) -> Option<String> {
    let start = t.started_at.as_deref().and_then(time::parse_ms)?;
    let end = t
        .finished_at
        .as_deref()
        .and_then(time::parse_ms)
        .unwrap_or_else(time::now_ms);
    Some(time::duration((end - start) / 1000.0))
}

/// How long an attempt ran; a running one's time is the header's "Ran for", which keeps up.
fn attempt_length(a: &Attempt) -> String {
    match (
        time::parse_ms(&a.started_at),
        a.ended_at.as_deref().and_then(time::parse_ms),
    ) {
        (Some(start), Some(end)) => time::duration((end - start) / 1000.0),
        _ => String::new(),
    }
}

fn gpu_hours(seconds: f64) -> String {
    if seconds < 360.0 {
        format!("{} GPU-minutes", (seconds / 60.0).round())
    } else {
        format!("{:.1} GPU-hours", seconds / 3600.0)
    }
}

/// An idle warning is easy to miss among the events: the latest one is said at the top while
/// the task runs, and the stop when idleness ended it (with the GPU-hours it held idle).
/// What the page says of results that are not simply there (`Task::results`).
fn results_notice(t: &Task) -> Option<(&'static str, &'static str)> {
    match t.results.as_deref()? {
        "uploading" => Some((
            "banner warn",
            "Results uploading: the run ended while the server or storage was away; its node keeps them and uploads them (the timeline says which node).",
        )),
        "lost" => Some((
            "banner error",
            "Results lost: they could not be kept (the timeline says why).",
        )),
        _ => None,
    }
}

fn idle_notice(state: TaskState, events: &[TaskEvent]) -> Option<(&'static str, &TaskEvent)> {
    let last = events
        .iter()
        .rev()
        .find(|e| e.kind == "idle" || e.kind == "idle_stop")?;
    match (state.is_finished(), last.kind.as_str()) {
        (false, "idle") => Some(("Idle GPUs, warned", last)),
        (_, "idle_stop") => Some(("Stopped for idle GPUs", last)),
        _ => None,
    }
}

/// What a researcher asks first of a task that failed: how it ended, where, after how many
/// tries. Said from its last attempt.
fn failure_summary(t: &Task, attempts: &[Attempt]) -> Option<String> {
    if t.state == TaskState::TimedOut {
        let limit = t.spec.time_limit.map(span_words).unwrap_or_default();
        return Some(format!(
            "It ran for its whole time limit ({limit}) and was stopped. Raise time_limit, or \
             checkpoint and submit it again to continue."
        ));
    }
    if t.state != TaskState::Failed {
        return None;
    }
    let Some(last) = attempts.iter().max_by_key(|a| a.number) else {
        return Some("It failed before it could start.".into());
    };
    let how = match (last.reason.as_deref(), last.exit_code) {
        (Some("oom"), _) => "ran out of GPU memory".to_owned(),
        (Some("node_lost"), _) => "lost its node".to_owned(),
        (_, Some(code)) => format!("exited with code {code}"),
        (Some(r), None) => exit_reason(Some(r), None).to_owned(),
        (None, None) => "stopped".to_owned(),
    };
    let node = last
        .node
        .clone()
        .or_else(|| last.placement.first().map(|p| p.node.clone()))
        .map(|n| format!(" on {n}"))
        .unwrap_or_default();
    let tries = match t.attempts {
        0 | 1 => String::new(),
        n => format!(" after {n} attempts"),
    };
    Some(format!(
        "Attempt {} {how}{node}{tries}. The log below ends where it stopped.",
        last.number
    ))
}

/// "2h 30m" for 9,000 seconds.
fn span_words(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    let parts: Vec<String> = [(d, "d"), (h, "h"), (m, "m"), (s, "s")]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, u)| format!("{n}{u}"))
        .collect();
    if parts.is_empty() {
        "0s".into()
    } else {
        parts.join(" ")
    }
}

fn exit_reason(reason: Option<&str>, code: Option<i32>) -> &'static str {
    match reason {
        Some("oom") => "out of GPU memory",
        Some("error") => "exited with an error",
        Some("preempted") => "preempted (checkpointed)",
        Some("drained") => "node drained",
        Some("node_lost") => "node lost",
        Some("cancelled") => "cancelled",
        Some("timed_out") => "reached its time limit",
        Some(_) => "other",
        None if code == Some(0) => "succeeded",
        None => "",
    }
}

fn priority_bars(p: PriorityFactors) -> impl IntoView {
    let rows = [
        ("Fair share", p.fair_share),
        ("Utilization", p.utilization),
        ("Deadline", p.deadline),
        ("Declared priority", p.declared),
        ("Age", p.age),
        ("GPU fit", p.gpu_fit),
        ("Total", p.total),
    ];
    view! {
        <div class="bars" data-testid="priority">
            {rows.into_iter().map(|(name, v)| {
                let pct = (v.clamp(0.0, 1.0) * 100.0).round();
                view! {
                    <div class="bar-row">
                        <span class="bar-label">{name}</span>
                        <span class="bar"><span class="bar-fill" style=format!("width:{pct}%")></span></span>
                        <span class="bar-value">{format!("{v:.2}")}</span>
                    </div>
                }
            }).collect_view()}
        </div>
    }
}

#[component]
fn LogTail(id: String) -> impl IntoView {
    let lines = RwSignal::new(Vec::<LogLine>::new());
    let status = RwSignal::new(TailStatus::Connecting);
    let follow = RwSignal::new(true);
    let query = RwSignal::new(String::new());
    let download_id = id.clone();
    live::tail_logs(id, lines, status);
    let box_ref = NodeRef::<leptos::html::Pre>::new();
    // Keep the newest line in view while following.
    Effect::new(move |_| {
        lines.track();
        query.track();
        if follow.get() {
            if let Some(el) = box_ref.get() {
                el.set_scroll_top(el.scroll_height());
            }
        }
    });
    view! {
        <div class="log-controls">
            <label class="check"><input type="checkbox" data-testid="log-follow" bind:checked=follow/>" Follow"</label>
            <div class="field inline">
                <label for="log-search">"Search"</label>
                <input id="log-search" type="search" data-testid="log-search" placeholder="filter lines" bind:value=query/>
            </div>
            <span class="badge" data-testid="log-status">{move || status.get().label()}</span>
            <span class="muted small" data-testid="log-count">{move || format!("{} lines", lines.with(Vec::len))}</span>
            <a class="button secondary small" data-testid="log-download" href=format!("/api/v1/tasks/{}/logs/download", encode(&download_id)) download>"Download log"</a>
        </div>
        <pre class="log" data-testid="log" node_ref=box_ref tabindex="0" role="log" aria-label="Log">
            // Keyed by sequence number: a new line adds one node and the window's oldest line
            // removes one, instead of rebuilding thousands of spans per line.
            <For
                each=move || {
                    let q = query.get().to_lowercase();
                    lines.with(|l| {
                        // Each line knows whether it opens a new attempt, for the separator.
                        let mut last = None;
                        l.iter()
                            .map(|line| {
                                let first = last.is_some_and(|a| a != line.attempt) || (last.is_none() && line.attempt > 1);
                                last = Some(line.attempt);
                                (line, first)
                            })
                            .filter(|(l, _)| q.is_empty() || l.line.to_lowercase().contains(&q))
                            .map(|(l, first)| (l.clone(), first))
                            .collect::<Vec<_>>()
                    })
                }
                key=|(l, first)| (l.seq, *first)
                children=move |(l, first): (LogLine, bool)| {
                    let class = if l.stream == "stderr" { "log-line stderr" } else { "log-line" };
                    let at = time::parse_ms(&l.at);
                    let zone = use_context::<time::ViewerZone>();
                    let stamp = move || at.map(|ms| time::clock(ms, zone.map_or(time::Zone::Utc, |z| z.0.get()))).unwrap_or_default();
                    view! {
                        {first.then(|| view! { <span class="log-attempt" data-testid="log-attempt">{format!("── attempt {} ──\n", l.attempt)}</span> })}
                        <span class=class data-seq=l.seq><span class="log-time" title=l.at.clone()>{stamp}" "</span>{l.rank.map(|r| view! { <span class="log-rank" data-testid="log-rank">{format!("[rank {r}] ")}</span> })}{l.line}"\n"</span>
                    }
                }
            />
        </pre>
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use autodl_common::tasks::WorkerPlacement;

    #[test]
    fn the_latest_idle_warning_shows_while_running_and_the_stop_after() {
        let e = |kind: &str, message: &str| TaskEvent {
            at: "2026-12-03T10:00:00.000Z".into(),
            kind: kind.into(),
            message: message.into(),
        };
        let warned = [e("submitted", "-"), e("idle", "first"), e("idle", "second")];
        let (head, last) = idle_notice(TaskState::Running, &warned).unwrap();
        assert_eq!(
            (head, last.message.as_str()),
            ("Idle GPUs, warned", "second")
        );
        // A warning is history once the task has ended for another reason.
        assert!(idle_notice(TaskState::Completed, &warned).is_none());
        let stopped = [e("idle", "w"), e("idle_stop", "0.50 GPU-hours idle")];
        let (head, last) = idle_notice(TaskState::Cancelled, &stopped).unwrap();
        assert_eq!(head, "Stopped for idle GPUs");
        assert!(last.message.contains("GPU-hours idle"));
        assert!(idle_notice(TaskState::Running, &warned[..1]).is_none());
    }

    #[test]
    fn results_not_simply_there_are_said() {
        let mut t = task(TaskState::Completed, 1);
        assert!(results_notice(&t).is_none());
        t.results = Some("uploading".into());
        assert!(results_notice(&t)
            .unwrap()
            .1
            .starts_with("Results uploading"));
        t.results = Some("lost".into());
        assert_eq!(results_notice(&t).unwrap().0, "banner error");
    }

    /// A task in `state` after `attempts` tries, for the pages' tests.
    pub(crate) fn task(state: TaskState, attempts: u32) -> Task {
        Task {
            id: "t".into(),
            name: "n".into(),
            state,
            user_id: "u".into(),
            user_email: "u@example.com".into(),
            tenant_id: "o".into(),
            spec: TaskSpec {
                name: "n".into(),
                image: "i".into(),
                command: vec!["true".into()],
                entry_point: None,
                env: Default::default(),
                gpu_types: vec![],
                gpus_per_worker: 1,
                gpu_memory: None,
                cpu: 1.0,
                memory: 1,
                num_workers: 1,
                launcher: Default::default(),
                priority: 0.5,
                deadline: None,
                estimated_runtime: None,
                time_limit: None,
                rendezvous_timeout: None,
                checkpoint: None,
                retry_policy: Default::default(),
                zone_affinity: false,
                bandwidth: String::new(),
                data_path: None,
                code: None,
                labels: Default::default(),
                batch_size: None,
                preemptible: true,
                after: Vec::new(),
                sweep: None,
                after_when: Default::default(),
                after_failure: Default::default(),
                kind: Default::default(),
                ports: Vec::new(),
            },
            created_at: "2026-12-02T10:00:00Z".into(),
            updated_at: "2026-12-02T10:00:00Z".into(),
            attempts,
            batch_size: None,
            placement: None,
            waiting: None,
            started_at: None,
            finished_at: None,
            gpu_seconds: 0.0,
            results: None,
        }
    }

    fn attempt(number: u32, reason: Option<&str>, exit_code: Option<i32>) -> Attempt {
        Attempt {
            number,
            node: None,
            placement: vec![WorkerPlacement {
                node: "gpu-7".into(),
                gpu_indices: vec![0],
                port: None,
            }],
            started_at: "2026-12-02T10:00:00Z".into(),
            ended_at: Some("2026-12-02T10:05:00Z".into()),
            exit_code,
            reason: reason.map(str::to_owned),
            batch_size: None,
            gpu_seconds: 300.0,
        }
    }

    #[test]
    fn a_failed_task_says_how_where_and_after_how_many_tries() {
        let t = task(TaskState::Failed, 3);
        let a = [
            attempt(1, Some("oom"), None),
            attempt(3, Some("error"), Some(137)),
            attempt(2, Some("oom"), None),
        ];
        assert_eq!(
            failure_summary(&t, &a).unwrap(),
            "Attempt 3 exited with code 137 on gpu-7 after 3 attempts. The log below ends where it stopped."
        );
        let oom = [attempt(1, Some("oom"), None)];
        assert!(failure_summary(&task(TaskState::Failed, 1), &oom)
            .unwrap()
            .starts_with("Attempt 1 ran out of GPU memory on gpu-7."));
        assert!(failure_summary(&task(TaskState::Completed, 1), &oom).is_none());
        let mut limited = task(TaskState::TimedOut, 1);
        limited.spec.time_limit = Some(9_000);
        assert!(
            failure_summary(&limited, &[attempt(1, Some("timed_out"), None)])
                .unwrap()
                .starts_with("It ran for its whole time limit (2h 30m)")
        );
        assert_eq!(span_words(90), "1m 30s");
        assert_eq!(span_words(86_400 + 3_600), "1d 1h");
        assert_eq!(gpu_hours(300.0), "5 GPU-minutes");
        assert_eq!(gpu_hours(7200.0), "2.0 GPU-hours");
        assert_eq!(bytes(17), "17 B");
        assert_eq!(bytes(200_000), "195.3 KiB");
        assert_eq!(bytes(40 << 30), "40 GiB");
    }
}
