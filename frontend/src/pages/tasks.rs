//! The tasks list (`/tasks`), and how tasks are shown wherever they appear (state badges,
//! GPUs, sizes, run time). One task's page is `task_view`.

use std::time::Duration;

use std::collections::BTreeSet;

use autodl_common::tasks::{Task, TaskPage, TaskSpec, TaskState};
use leptos::prelude::*;
use leptos_router::hooks::{use_navigate, use_query_map};

use super::compare::MAX_COMPARED;
use crate::api;
use crate::live;
use crate::paths;
use crate::session::RequireLogin;
use crate::time::{self, Time};

pub fn state_badge(state: TaskState) -> impl IntoView {
    view! { <span class=format!("badge state-{}", state.as_str()) data-testid="state">{state.as_str()}</span> }
}

/// "2 × A100" style summary of what a task asks for ("2–8 × A100" for an elastic task).
pub fn gpu_summary(spec: &TaskSpec) -> String {
    let n = spec.gpus_per_worker * spec.num_workers;
    if n == 0 {
        return "none".into();
    }
    let n = match spec.min_workers {
        Some(min) => format!("{}–{n}", spec.gpus_per_worker * min),
        None => n.to_string(),
    };
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

pub(super) fn trim_num(v: f64) -> String {
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
    let pairs = [
        Some(("limit", "25")),
        (!state.is_empty()).then_some(("state", state)),
        (!label.trim().is_empty()).then_some(("label", label.trim())),
        mine.then_some(("user", "me")),
        cursor.map(|c| ("cursor", c)),
    ];
    format!(
        "{}?{}",
        paths::tasks(),
        paths::query(pairs.into_iter().flatten())
    )
}

pub use crate::paths::encode;

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
        let pairs = [
            (!self.state.is_empty()).then_some(("state", self.state.as_str())),
            (!self.label.trim().is_empty()).then_some(("label", self.label.trim())),
            self.mine.then_some(("mine", "1")),
            (!self.search.is_empty()).then_some(("q", self.search.as_str())),
            self.cursor.as_deref().map(|c| ("cursor", c)),
        ];
        let q = paths::query(pairs.into_iter().flatten());
        if q.is_empty() {
            "/tasks".into()
        } else {
            format!("/tasks?{q}")
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
                let path = paths::task_cancel(id);
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
                        {TaskState::ALL.iter().copied().map(|s| view! {
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
                    }/></th><th>"Name"</th><th>"State"</th><th>"GPUs"</th><th>"User"</th><th>"Labels"</th><th>"Metrics"</th><th>"Created ↓"</th><th>"Ran for"</th><th>"Waiting"</th></tr></thead>
                <tbody>
                {move || match tasks.get() {
                    None => view! { <tr><td colspan="10" class="muted">"Loading…"</td></tr> }.into_any(),
                    Some(Err(_)) => view! { <tr><td colspan="10" class="muted">"—"</td></tr> }.into_any(),
                    Some(Ok(page)) => {
                        let needle = current.get().search.to_lowercase();
                        let rows: Vec<Task> = page.items.into_iter().filter(|t| named(t, &needle)).collect();
                        if rows.is_empty() {
                            return view! { <tr><td colspan="10" class="muted" data-testid="no-tasks">"No tasks match."</td></tr> }.into_any();
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
                                    <td data-label="Name"><span class="muted small task-number" data-testid="task-number">{format!("#{} ", t.number)}</span><a href=format!("/tasks/{}", t.id)>{t.name.clone()}</a></td>
                                    <td data-label="State">{state_badge(t.state)}</td>
                                    <td data-label="GPUs">{gpu_summary(&t.spec)}</td>
                                    <td data-label="User">{t.user_email.clone()}</td>
                                    <td data-label="Labels" class="labels" data-testid="task-labels">{t.spec.labels.iter().map(|(k, v)| view! { <span class="badge label">{format!("{k}={v}")}</span> }).collect_view()}</td>
                                    <td data-label="Metrics" class="labels" data-testid="task-metrics" title=summary_title(&t)>{headline(&t).into_iter().map(|(k, v)| view! { <span class="badge metric">{format!("{k} {}", crate::plot::significant(v, 4))}</span> }).collect_view()}</td>
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

/// Whether a task's name holds the (lower-cased) search typed over the list.
/// Whether the search box's text is in the task's name, or is its number (`#412` or `412`).
fn named(t: &Task, needle: &str) -> bool {
    needle.is_empty()
        || t.name.to_lowercase().contains(needle)
        || needle.trim_start_matches('#') == t.number.to_string()
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

/// A task's summary in a row: its losses first, then accuracies, then the rest, at most three;
/// counters (`step`, `epoch`) are left to its page.
fn headline(t: &Task) -> Vec<(String, f64)> {
    let rank = |k: &str| {
        if k.contains("loss") {
            0
        } else if k.contains("acc") {
            1
        } else {
            2
        }
    };
    let mut shown: Vec<(String, f64)> = t
        .summary
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "step" | "epoch" | "global_step"))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    shown.sort_by(|a, b| rank(&a.0).cmp(&rank(&b.0)).then_with(|| a.0.cmp(&b.0)));
    shown.truncate(3);
    shown
}

/// Every number of a task's summary, for the cell's tooltip.
fn summary_title(t: &Task) -> String {
    t.summary
        .iter()
        .map(|(k, v)| format!("{k} = {}", crate::plot::significant(*v, 6)))
        .collect::<Vec<_>>()
        .join("\n")
}
