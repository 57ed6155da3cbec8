//! The tasks list (`/tasks`) and one task's page (`/tasks/:id`): state, why it waits, events,
//! attempts, a live log tail and live GPU charts.

use std::time::Duration;

use autodl_common::tasks::{
    Attempt, Checkpoint, LogLine, MetricSample, PriorityFactors, Task, TaskEvent, TaskPage,
    TaskSpec, TaskState,
};
use leptos::prelude::*;
use leptos_router::hooks::{use_navigate, use_params_map, use_query_map};

use super::account::short_date;
use crate::api::{self, ApiErr};
use crate::app::{general_error, RequireLogin};
use crate::chart::{LineChart, Series, PALETTE};
use crate::form::spec_to_input;
use crate::live::{self, TailStatus};

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
    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    let g = b as f64 / GIB;
    if g >= 1.0 {
        format!("{} GiB", trim_num(g))
    } else {
        format!("{} MiB", trim_num(b as f64 / 1024.0 / 1024.0))
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
    // What is typed, before it is applied.
    let label = RwSignal::new(current.get_untracked().label);
    let search = RwSignal::new(current.get_untracked().search);
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
                    <input id="filter-label" name="label" data-testid="filter-label" placeholder="team=vision" bind:value=label
                        on:change=move |_| { let l = label.get_untracked(); go3(&move |q: &mut ListQuery| { q.label = l.clone(); q.cursor = None; }, false); }/>
                </div>
                <div class="field">
                    <label for="filter-search">"Search names"</label>
                    <input id="filter-search" name="q" data-testid="filter-search" type="search" placeholder="resnet" bind:value=search
                        on:input=move |_| { let s = search.get_untracked(); go4(&move |q: &mut ListQuery| q.search = s.clone(), true); }/>
                </div>
                <label class="check"><input type="checkbox" name="mine" value="1" data-testid="filter-mine" prop:checked=move || current.get().mine
                    on:change=move |ev| { let m = event_target_checked(&ev); go5(&move |q: &mut ListQuery| { q.mine = m; q.cursor = None; }, false); }/>" Mine only"</label>
                <button type="submit" class="small secondary" data-testid="filter-apply">"Apply"</button>
            </form>
            {move || tasks.get().and_then(|r| r.err()).map(|e| view! { <p class="banner error" role="alert">{e.message}</p> })}
            <table class="table" data-testid="tasks">
                <thead><tr><th>"Name"</th><th>"State"</th><th>"GPUs"</th><th>"User"</th><th>"Created ↓"</th><th>"Waiting"</th></tr></thead>
                <tbody>
                {move || match tasks.get() {
                    None => view! { <tr><td colspan="6" class="muted">"Loading…"</td></tr> }.into_any(),
                    Some(Err(_)) => view! { <tr><td colspan="6" class="muted">"—"</td></tr> }.into_any(),
                    Some(Ok(page)) => {
                        let needle = current.get().search.to_lowercase();
                        let rows: Vec<Task> = page.items.into_iter().filter(|t| needle.is_empty() || t.name.to_lowercase().contains(&needle)).collect();
                        if rows.is_empty() {
                            return view! { <tr><td colspan="6" class="muted" data-testid="no-tasks">"No tasks match."</td></tr> }.into_any();
                        }
                        rows.into_iter().map(|t| {
                            let waiting = t.waiting.as_ref().map(|w| w.message.clone()).unwrap_or_default();
                            view! {
                                <tr data-testid="task-row" data-task=t.id.clone()>
                                    <td><a href=format!("/tasks/{}", t.id)>{t.name.clone()}</a></td>
                                    <td>{state_badge(t.state)}</td>
                                    <td>{gpu_summary(&t.spec)}</td>
                                    <td>{t.user_email.clone()}</td>
                                    <td>{short_date(&t.created_at)}</td>
                                    <td class="muted small">{waiting}</td>
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
                        <dl class="facts">
                            <dt>"Submitted"</dt><dd>{short_date(&t.created_at)}" by "{t.user_email.clone()}</dd>
                            <dt>"Image"</dt><dd><code>{t.spec.image.clone()}</code></dd>
                            <dt>"Command"</dt><dd><code>{t.spec.command.join(" ")}</code></dd>
                            <dt>"GPUs"</dt><dd>{gpu_summary(&t.spec)}</dd>
                            <dt>"Priority"</dt><dd>{format!("{:.2}", t.spec.priority)}</dd>
                            <dt>"Attempts"</dt><dd>{t.attempts}</dd>
                            {(!placement.is_empty()).then(|| view! { <dt>"Placed on"</dt><dd>{placement.clone()}</dd> })}
                            {(!t.spec.labels.is_empty()).then(|| view! { <dt>"Labels"</dt><dd>{t.spec.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")}</dd> })}
                        </dl>
                    </section>
                    {t.waiting.clone().map(|w| view! {
                        <section class="card" data-testid="waiting">
                            <h2>"Why it waits"</h2>
                            <p>{w.message.clone()}</p>
                            {w.position.map(|p| view! { <p class="muted">"Position in the queue: " <strong>{p + 1}</strong></p> })}
                            <p class="muted" data-testid="estimated-start">"Expected to start: " <strong>{w.estimated_start.as_deref().map_or_else(|| "not estimated yet".to_owned(), short_date)}</strong></p>
                            {w.priority.clone().map(priority_bars)}
                        </section>
                    })}
                }.into_any()
            }
        }}
        <section class="card">
            <h2>"Live metrics"</h2>
            <Metrics id=id.clone()/>
        </section>
        <section class="card">
            <h2>"Log"</h2>
            <LogTail id=id.clone()/>
        </section>
        <section class="card">
            <h2>"Attempts"</h2>
            <table class="table" data-testid="attempts">
                <thead><tr><th>"#"</th><th>"Node / GPUs"</th><th>"Started"</th><th>"Ended"</th><th>"Exit"</th><th>"Reason"</th></tr></thead>
                <tbody>
                {move || {
                    let list = attempts.get().and_then(|r| r.ok()).unwrap_or_default();
                    if list.is_empty() {
                        return view! { <tr><td colspan="6" class="muted">"No attempts yet."</td></tr> }.into_any();
                    }
                    list.into_iter().map(|a| {
                        let place = a.placement.iter().map(|p| format!("{} {:?}", p.node, p.gpu_indices)).collect::<Vec<_>>().join(", ");
                        view! {
                            <tr>
                                <td>{a.number}</td>
                                <td>{if place.is_empty() { a.node.clone().unwrap_or_default() } else { place }}</td>
                                <td>{short_date(&a.started_at)}</td>
                                <td>{a.ended_at.as_deref().map(short_date).unwrap_or_else(|| "running".into())}</td>
                                <td>{a.exit_code.map(|c| c.to_string()).unwrap_or_default()}</td>
                                <td>{exit_reason(a.reason.as_deref(), a.exit_code)}</td>
                            </tr>
                        }
                    }).collect_view().into_any()
                }}
                </tbody>
            </table>
        </section>
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
                            <td>{short_date(&c.created_at)}</td>
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
                    <li><span class="muted">{short_time(&e.at)}</span>" "<span class="badge">{e.kind.clone()}</span>" "{e.message.clone()}</li>
                }).collect_view()}
            </ol>
        </section>
        </Transition>
    }
}

fn short_time(at: &str) -> String {
    at.get(..19).unwrap_or(at).replace('T', " ")
}

fn exit_reason(reason: Option<&str>, code: Option<i32>) -> &'static str {
    match reason {
        Some("oom") => "out of GPU memory",
        Some("error") => "exited with an error",
        Some("preempted") => "preempted (checkpointed)",
        Some("drained") => "node drained",
        Some("node_lost") => "node lost",
        Some("cancelled") => "cancelled",
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
        </div>
        <pre class="log" data-testid="log" node_ref=box_ref tabindex="0" aria-label="Log">
            // Keyed by sequence number: a new line adds one node and the window's oldest line
            // removes one, instead of rebuilding thousands of spans per line.
            <For
                each=move || {
                    let q = query.get().to_lowercase();
                    lines.with(|l| {
                        l.iter()
                            .filter(|l| q.is_empty() || l.line.to_lowercase().contains(&q))
                            .cloned()
                            .collect::<Vec<_>>()
                    })
                }
                key=|l| l.seq
                children=move |l: LogLine| {
                    let class = if l.stream == "stderr" { "log-line stderr" } else { "log-line" };
                    view! { <span class=class data-seq=l.seq>{l.line}"\n"</span> }
                }
            />
        </pre>
    }
}

#[component]
fn Metrics(id: String) -> impl IntoView {
    let samples = RwSignal::new(Vec::<MetricSample>::new());
    let status = RwSignal::new(TailStatus::Connecting);
    // Pushed by the server as they arrive; a dropped stream resumes after the last sample.
    let url = move || {
        let after = samples.with_untracked(|s| s.last().map(|s| s.at.clone()));
        match after {
            Some(a) => format!("/api/v1/tasks/{id}/metrics/stream?after={}", encode(&a)),
            None => format!("/api/v1/tasks/{id}/metrics/stream"),
        }
    };
    live::follow(
        url,
        move |s: MetricSample| {
            samples.update(|list| {
                list.push(s);
                if list.len() > 2000 {
                    let extra = list.len() - 2000;
                    list.drain(..extra);
                }
            })
        },
        status,
    );
    let pick = move |f: fn(&MetricSample) -> Option<f64>| {
        samples.with(|s| {
            s.iter()
                .filter_map(|m| f(m).map(|v| (live::epoch_secs(&m.at), v)))
                .collect::<Vec<_>>()
        })
    };
    let util = Signal::derive(move || {
        vec![Series {
            name: "GPU utilization (mean)".into(),
            color: PALETTE[0],
            points: pick(|m| m.gpu_util.map(|u| u * 100.0)),
        }]
    });
    let mem = Signal::derive(move || {
        const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
        vec![
            Series {
                name: "used".into(),
                color: PALETTE[1],
                points: pick(|m| m.mem_used.map(|b| b as f64 / GIB)),
            },
            Series {
                name: "total".into(),
                color: "#98a2b3",
                points: pick(|m| m.mem_total.map(|b| b as f64 / GIB)),
            },
        ]
    });
    let training = Signal::derive(move || {
        vec![
            Series {
                name: "loss".into(),
                color: PALETTE[2],
                points: pick(|m| m.loss),
            },
            Series {
                name: "epoch".into(),
                color: PALETTE[3],
                points: pick(|m| m.epoch),
            },
        ]
    });
    let has_training = move || training.with(|t| t.iter().any(|s| !s.points.is_empty()));
    view! {
        <p class="muted small">"Stream: " <span data-testid="metrics-status">{move || status.get().label()}</span></p>
        <div class="charts">
            <LineChart title="GPU utilization" unit="%" testid="chart-util" series=util y_max=100.0/>
            <LineChart title="GPU memory" unit="GiB" testid="chart-mem" series=mem/>
            {move || has_training().then(|| view! {
                <LineChart title="Training (reported)" unit="" testid="chart-training" series=training/>
            })}
        </div>
    }
}
