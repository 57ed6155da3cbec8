//! Sweeps (`/sweeps`, `/sweeps/:id`): the organization's sweeps, and one sweep as a table of
//! its trials (parameters, state, newest metrics), sortable by any column, with the best few
//! a click away from the compare page and the whole sweep one click from cancelled.

use std::time::Duration;

use autodl_common::tasks::{Sweep, SweepTrialRow, TaskState};
use leptos::prelude::*;
use leptos_router::hooks::use_params_map;
use serde_json::Value;

use super::compare::MAX_COMPARED;
use super::tasks::{encode, state_badge};
use crate::api::{self, ApiErr};
use crate::fields::general_error;
use crate::live;
use crate::paths;
use crate::plot;
use crate::session::RequireLogin;
use crate::time;

#[component]
pub fn SweepsPage() -> impl IntoView {
    view! { <RequireLogin><SweepList/></RequireLogin> }
}

#[component]
pub fn SweepPage() -> impl IntoView {
    view! { <RequireLogin><SweepTable/></RequireLogin> }
}

fn states_text(s: &Sweep) -> String {
    if s.states.is_empty() {
        return "—".into();
    }
    s.states
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn finished(s: &Sweep) -> bool {
    let ended: u32 = s
        .states
        .iter()
        .filter(|(k, _)| TaskState::parse(k).is_some_and(TaskState::is_finished))
        .map(|(_, n)| n)
        .sum();
    ended >= s.trials
}

#[component]
fn SweepList() -> impl IntoView {
    let tick = live::ticker(Duration::from_secs(5));
    let sweeps = Resource::new(
        move || tick.get(),
        |_| api::get::<Vec<Sweep>>(paths::sweeps()),
    );
    view! {
        <section class="card">
            <h1>"Sweeps"</h1>
            <p class="muted">"A sweep runs one task file over a parameter grid or a random search: "
                <code>"autodl sweep run task.yaml --param lr=0.1,0.01"</code>", or "
                <code>"client.submit_sweep(...)"</code>" in Python."</p>
            <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
                {move || sweeps.get().map(|r| match r {
                    Err(e) => view! { <p class="banner error" role="alert">{e.message}</p> }.into_any(),
                    Ok(list) if list.is_empty() => view! { <p class="muted" data-testid="sweeps-empty">"No sweeps yet."</p> }.into_any(),
                    Ok(list) => view! {
                        <div class="table-wrap"><table class="table" data-testid="sweeps">
                            <thead><tr><th>"Name"</th><th>"Trials"</th><th>"States"</th><th>"By"</th><th>"Created"</th></tr></thead>
                            <tbody>
                                {list.into_iter().map(|s| {
                                    let states = states_text(&s);
                                    view! {
                                        <tr data-testid="sweep-row">
                                            <td><a href=format!("/sweeps/{}", encode(&s.id))>{s.name.clone()}</a></td>
                                            <td>{s.trials}</td>
                                            <td>{states}</td>
                                            <td>{s.user_email.clone()}</td>
                                            <td>{time::local(&s.created_at)}</td>
                                        </tr>
                                    }
                                }).collect_view()}
                            </tbody>
                        </table></div>
                    }.into_any(),
                })}
            </Transition>
        </section>
    }
}

/// A cell's text: text as is, numbers short.
fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "—".into(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => i.to_string(),
            (None, Some(f)) => {
                let s = format!("{f:.4}");
                let s = s.trim_end_matches('0').trim_end_matches('.');
                if s == "0" || s == "-0" {
                    format!("{f:.3e}")
                } else {
                    s.to_owned()
                }
            }
            _ => n.to_string(),
        },
        Some(other) => other.to_string(),
    }
}

/// How rows compare on a column: numbers by value, then text; missing values last.
fn order(a: Option<&Value>, b: Option<&Value>) -> std::cmp::Ordering {
    use std::cmp::Ordering::*;
    match (a, b) {
        (None, None) => Equal,
        (None, _) => Greater,
        (_, None) => Less,
        (Some(x), Some(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(p), Some(q)) => p.partial_cmp(&q).unwrap_or(Equal),
            _ => x.to_string().cmp(&y.to_string()),
        },
    }
}

/// A column of the table: a parameter or a metric.
#[derive(Clone, PartialEq)]
enum Column {
    Trial,
    Param(String),
    Metric(String),
}

fn value_of<'a>(r: &'a SweepTrialRow, c: &Column) -> Option<&'a Value> {
    match c {
        Column::Trial => None,
        Column::Param(p) => r.params.get(p),
        Column::Metric(m) => r.metrics.get(m),
    }
}

/// The trials across their parameters to the objective, once two of them have it.
fn parallel_view(s: &Sweep, metrics: &[String]) -> Option<impl IntoView> {
    // Without a metric of the sweep's own: a loss, else the first number that is not a
    // counter of progress.
    let counters = ["step", "epoch", "global_step", "iteration", "iter"];
    let objective = s
        .metric
        .clone()
        .or_else(|| metrics.iter().find(|m| m.contains("loss")).cloned())
        .or_else(|| {
            metrics
                .iter()
                .find(|m| !counters.contains(&m.as_str()))
                .cloned()
        })?;
    if s.parameters.is_empty() {
        return None;
    }
    let trials: Vec<_> = s
        .items
        .iter()
        .map(|r| {
            (
                r.trial,
                r.params.clone(),
                r.metrics.get(&objective).and_then(Value::as_f64),
            )
        })
        .collect();
    let lower = s.mode != Some(autodl_common::tasks::MetricGoal::Max);
    let (axes, lines) = plot::parallel(&s.parameters, &objective, lower, &trials);
    (lines.len() >= 2).then(|| {
        view! {
            <h2>"Parameters and " {objective.clone()}</h2>
            <crate::chart::ParallelChart axes lines testid="sweep-parallel"/>
        }
    })
}

#[component]
fn SweepTable() -> impl IntoView {
    let params = use_params_map();
    let id = Memo::new(move |_| params.with(|p| p.get("id").unwrap_or_default()));
    let tick = live::ticker(Duration::from_secs(3));
    let sweep = Resource::new(
        move || (id.get(), tick.get()),
        |(id, _)| async move { api::get::<Sweep>(paths::sweep(&id)).await },
    );
    // Sorted by (column, descending); by trial at first.
    let sort = RwSignal::new((Column::Trial, false));
    let error = RwSignal::new(None::<ApiErr>);
    let cancel = Action::new_local(move |_: &()| {
        let path = paths::sweep_cancel(&id.get_untracked());
        async move { api::post::<_, Value>(&path, &serde_json::json!({})).await }
    });
    Effect::new(move |_| match cancel.value().get() {
        Some(Ok(_)) => {
            error.set(None);
            sweep.refetch();
        }
        Some(Err(e)) => error.set(Some(e)),
        None => {}
    });
    let header = move |label: String, col: Column| {
        let c2 = col.clone();
        let arrow = move || match sort.get() {
            (c, true) if c == c2 => " ▼",
            (c, false) if c == c2 => " ▲",
            _ => "",
        };
        let c3 = col.clone();
        view! {
            <th scope="col">
                <button class="link sort" on:click=move |_| sort.update(|s| {
                    if s.0 == c3 { s.1 = !s.1 } else { *s = (c3.clone(), false) }
                })>{label}{arrow}</button>
            </th>
        }
    };
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        {move || sweep.get().map(|r| match r {
            Err(e) => view! { <section class="card"><p class="banner error" role="alert">{e.message}</p></section> }.into_any(),
            Ok(s) => {
                let metrics: Vec<String> = {
                    // A parameter the trial also reports (`lr`) is shown once, as a parameter.
                    let mut m: Vec<String> = s.items.iter().flat_map(|r| r.metrics.keys().cloned())
                        .filter(|k| !s.parameters.contains(k)).collect();
                    m.sort();
                    m.dedup();
                    m
                };
                // Per metric, enough digits that trials with different values read differently.
                let digits: std::collections::BTreeMap<String, usize> = metrics.iter().map(|m| {
                    let vs: Vec<f64> = s.items.iter().filter_map(|r| r.metrics.get(m).and_then(Value::as_f64)).collect();
                    (m.clone(), plot::distinct_digits(&vs))
                }).collect();
                let mut rows = s.items.clone();
                let (col, desc) = sort.get();
                if col != Column::Trial {
                    rows.sort_by(|a, b| order(value_of(a, &col), value_of(b, &col)));
                    if desc {
                        // Missing values stay last either way.
                        let (with, without): (Vec<_>, Vec<_>) = rows.into_iter().partition(|r| value_of(r, &col).is_some());
                        rows = with.into_iter().rev().chain(without).collect();
                    }
                } else if desc {
                    rows.reverse();
                }
                let best: Vec<String> = rows.iter().filter(|r| r.state == TaskState::Completed && r.stopped_early.is_none()).take(MAX_COMPARED).map(|r| r.task_id.clone()).collect();
                let compare = (best.len() >= 2).then(|| format!("/compare?ids={}", best.join(",")));
                let done = finished(&s);
                let cols_p: Vec<String> = s.parameters.clone();
                let cols_m = metrics.clone();
                view! {
                    <section class="card">
                        <p class="crumbs"><a href="/sweeps">"Sweeps"</a>" / "</p>
                        <h1 data-testid="sweep-name">{s.name.clone()}</h1>
                        <p data-testid="sweep-summary">
                            {format!("{} trials ({}), at most {} at once: {}", s.trials,
                                match s.method {
                                    autodl_common::tasks::SweepMethod::Random => "random",
                                    autodl_common::tasks::SweepMethod::Grid => "grid",
                                    autodl_common::tasks::SweepMethod::Asha => "ASHA",
                                },
                                s.max_concurrency, states_text(&s))}
                        </p>
                        {s.metric.clone().map(|m| view! {
                            <p data-testid="sweep-objective">{format!("Optimises {m} ({} is better)",
                                if s.mode == Some(autodl_common::tasks::MetricGoal::Max) { "higher" } else { "lower" })}</p>
                        })}
                        {s.early_stopping.clone().map(|e| {
                            let stopped = s.items.iter().filter(|r| r.stopped_early.is_some()).count();
                            // The last rung is the budget: nobody is judged there.
                            let mut rungs: Vec<String> = e.rungs.iter().map(|r| cell(Some(&serde_json::json!(r)))).collect();
                            let budget = rungs.pop().unwrap_or_default();
                            view! {
                                <p data-testid="sweep-asha">{format!(
                                    "Stops trials early: at {} {} (of {budget}), a trial not among the best 1/{} of those there before it stops. {stopped} stopped so far.",
                                    e.resource, rungs.join(", "), e.reduction_factor)}</p>
                            }
                        })}
                        <p class="muted">{format!("By {} · {}", s.user_email, time::local(&s.created_at))}</p>
                        <div class="actions">
                            {compare.map(|href| view! { <a class="button secondary" href=href data-testid="sweep-compare">{format!("Compare the first {} completed", best.len())}</a> })}
                            <button class="danger" data-testid="sweep-cancel" disabled=done
                                on:click=move |_| if live::confirm("Cancel every trial of this sweep that has not ended?") { cancel.dispatch(()); }>
                                "Cancel sweep"
                            </button>
                        </div>
                        <Show when=move || error.get().is_some()>
                            <p class="banner error" role="alert">{move || general_error(error.get(), &[])}</p>
                        </Show>
                        <div class="table-wrap"><table class="table" data-testid="sweep-trials">
                            <thead><tr>
                                {header("Trial".into(), Column::Trial)}
                                <th scope="col">"State"</th>
                                {cols_p.iter().map(|p| header(p.clone(), Column::Param(p.clone()))).collect_view()}
                                {cols_m.iter().map(|m| header(m.clone(), Column::Metric(m.clone()))).collect_view()}
                            </tr></thead>
                            <tbody>
                                {rows.into_iter().map(|r| {
                                    let ps: Vec<String> = s.parameters.iter().map(|p| cell(r.params.get(p))).collect();
                                    let ms: Vec<String> = metrics.iter().map(|m| match r.metrics.get(m) {
                                        Some(Value::Number(n)) if n.is_f64() => plot::significant(n.as_f64().unwrap_or(0.0), digits.get(m).copied().unwrap_or(3)),
                                        other => cell(other),
                                    }).collect();
                                    view! {
                                        <tr data-testid="trial-row" data-trial=r.trial>
                                            <td><a href=format!("/tasks/{}", encode(&r.task_id))>{format!("#{}", r.trial)}</a></td>
                                            <td>{match r.stopped_early.clone() {
                                                Some(why) => view! { <span class="badge warn" title=why data-testid="stopped-early">"stopped early"</span> }.into_any(),
                                                None => state_badge(r.state).into_any(),
                                            }}</td>
                                            {ps.into_iter().map(|v| view! { <td class="num">{v}</td> }).collect_view()}
                                            {ms.into_iter().map(|v| view! { <td class="num">{v}</td> }).collect_view()}
                                        </tr>
                                    }
                                }).collect_view()}
                            </tbody>
                        </table></div>
                        {parallel_view(&s, &metrics)}
                    </section>
                }.into_any()
            }
        })}
        </Transition>
    }
}
