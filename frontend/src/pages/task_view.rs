//! One task's page (`/tasks/:id`): its state and why it waits, events, attempts, checkpoints
//! and results, a live log tail and live GPU charts.

use std::time::Duration;

use autodl_common::agent::ArtifactFile;
use autodl_common::tasks::{
    AfterWhen, Attempt, Checkpoint, LogLine, PriorityFactors, Task, TaskEvent, TaskSpec, TaskState,
};
use leptos::prelude::*;
use leptos_router::hooks::{use_navigate, use_params_map};

use super::metrics::{ChartHistory, Metrics};
use super::task_notices::{exit_reason, failure_summary, idle_notice, results_notice, span_words};
use super::tasks::{bytes, gpu_summary, ran_for, state_badge};
use crate::api::{self, ApiErr};
use crate::fields::general_error;

use crate::live::{self, TailStatus};
use crate::paths;
use crate::session::RequireLogin;
use crate::time::{self, Time};

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
    let tid = StoredValue::new(id.clone());
    let task = Resource::new(
        move || {
            // Once finished, a task no longer changes: stop polling.
            let tick = if finished.get() { 0 } else { tick.get() };
            (tick, paths::task(&tid.get_value()))
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
        move || (version.get(), paths::task_events(&tid.get_value())),
        |(_, path)| async move { api::get::<Vec<TaskEvent>>(&path).await },
    );
    let attempts = Resource::new(
        move || (version.get(), paths::task_attempts(&tid.get_value())),
        |(_, path)| async move { api::get::<Vec<Attempt>>(&path).await },
    );
    let checkpoints = Resource::new(
        move || (version.get(), paths::task_checkpoints(&tid.get_value())),
        |(_, path)| async move { api::get::<Vec<Checkpoint>>(&path).await },
    );
    let history = ChartHistory::new(&id);
    let is_running =
        Memo::new(move |_| matches!(task.get(), Some(Ok(ref t)) if t.state == TaskState::Running));
    let missing = Memo::new(
        move |_| matches!(task.get(), Some(Err(ref e)) if e.status == 404 || e.status == 403),
    );
    let results = Resource::new(
        move || (version.get(), paths::task_result_files(&tid.get_value())),
        |(_, path)| async move { api::get::<Vec<ArtifactFile>>(&path).await },
    );
    let error = RwSignal::new(None::<ApiErr>);
    let navigate = use_navigate();
    let cancel = Action::new_local(move |_: &()| {
        let path = paths::task_cancel(&tid.get_value());
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
        let input = spec.to_input();
        async move { api::post::<_, Task>(paths::tasks(), &input).await }
    });
    let nav = navigate.clone();
    Effect::new(move |_| match retry.value().get() {
        Some(Ok(t)) => nav(&format!("/tasks/{}", t.id), Default::default()),
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    let results_msg = RwSignal::new(None::<String>);
    let download = Action::new_local(move |_: &()| {
        let path = paths::task_results(&tid.get_value());
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
                        <p class="crumbs"><a href="/tasks">"Tasks"</a>" / "<span data-testid="task-number">{format!("#{}", t.number)}</span></p>
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
                                // Offered once there are results to download.
                                {move || results.get().and_then(|r| r.ok()).is_some_and(|l| !l.is_empty()).then(|| view! {
                                    <button type="button" class="secondary" data-testid="download" on:click=move |_| { download.dispatch(()); }>"Download results"</button>
                                })}
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
                                            let href = paths::task_port_open(&tid.get_value(), &p.to_string());
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
                <crate::terminal::TerminalPanel task_id=tid.get_value()/>
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
                            let href = paths::task_result_file(&tid.get_value(), &f.path);
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

pub(super) fn gpu_hours(seconds: f64) -> String {
    if seconds < 360.0 {
        format!("{} GPU-minutes", (seconds / 60.0).round())
    } else {
        format!("{:.1} GPU-hours", seconds / 3600.0)
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
            <a class="button secondary small" data-testid="log-download" href=paths::task_log_download(&download_id) download>"Download log"</a>
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
