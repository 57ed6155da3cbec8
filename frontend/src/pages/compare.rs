//! Two to five tasks side by side (`/compare?ids=a,b`): one metric of each on one chart, by
//! step when they all report steps (else by time since each started), and a table of what
//! differs between their specs, so a researcher sees which change made which curve.

use autodl_common::metrics::{is_gpu_line, MetricLines, GPU_UTIL};
use autodl_common::tasks::Task;
use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use super::metrics::{on_axis, step_points, unit_label};
use super::tasks::{ran_for, state_badge};
use crate::api::{self, ApiErr};
use crate::chart::{LineChart, Series, PALETTE};
use crate::paths;
use crate::plot::{self, XAxis};
use crate::session::RequireLogin;
use crate::time;

/// At most this many tasks on one chart.
pub const MAX_COMPARED: usize = 5;

#[component]
pub fn ComparePage() -> impl IntoView {
    view! { <RequireLogin><Compare/></RequireLogin> }
}

/// The ids in `?ids=`, in order, without repeats.
fn ids_of(raw: &str) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for id in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if !ids.iter().any(|i| i == id) {
            ids.push(id.to_owned());
        }
    }
    ids
}

#[component]
fn Compare() -> impl IntoView {
    let query = use_query_map();
    let ids = Memo::new(move |_| query.with(|q| ids_of(&q.get("ids").unwrap_or_default())));
    let data = Resource::new(
        move || ids.get(),
        |ids| async move {
            if ids.len() > MAX_COMPARED {
                return Err(ApiErr {
                    status: 400,
                    code: "validation".into(),
                    message: format!("Compare at most {MAX_COMPARED} tasks at once."),
                    field: None,
                });
            }
            let mut out = Vec::new();
            for id in ids {
                let t = api::get::<Task>(paths::task(&id)).await?;
                let l = api::get::<MetricLines>(&format!(
                    "{}?points=400",
                    paths::task_metric_lines(&id)
                ))
                .await?;
                out.push((t, l));
            }
            Ok(out)
        },
    );
    let chosen = RwSignal::new(None::<String>);
    let smoothing = RwSignal::new(0.0f64);
    let list = move || data.get().and_then(|r| r.ok()).unwrap_or_default();
    // Every line any of them has: reported numbers first, then the GPUs'.
    let names = move || {
        let mut names: Vec<String> = list()
            .iter()
            .flat_map(|(_, l)| l.lines.iter().map(|l| l.name.clone()))
            .collect();
        names.sort_by(|a, b| (is_gpu_line(a), a).cmp(&(is_gpu_line(b), b)));
        names.dedup();
        names
    };
    let metric = move || {
        chosen.get().unwrap_or_else(|| {
            let n = names();
            n.iter()
                .find(|n| *n == "loss")
                .or_else(|| n.iter().find(|n| !is_gpu_line(n)))
                .cloned()
                .unwrap_or_else(|| GPU_UTIL.into())
        })
    };
    let by_step = move || {
        let l = list();
        !l.is_empty() && l.iter().all(|(_, m)| step_points(&m.lines).len() > 1)
    };
    let axis = Signal::derive(move || {
        if by_step() {
            XAxis::Step
        } else {
            XAxis::Elapsed
        }
    });
    let series = Signal::derive(move || {
        let name = metric();
        let weight = smoothing.get();
        let axis = axis.get();
        let mut out = Vec::new();
        for (i, (t, m)) in list().iter().enumerate() {
            let Some(line) = m.lines.iter().find(|l| l.name == name) else {
                continue;
            };
            let start = t
                .started_at
                .as_deref()
                .and_then(time::parse_ms)
                .or_else(|| {
                    m.lines
                        .iter()
                        .filter_map(|l| l.points.first().map(|p| p[0]))
                        .reduce(f64::min)
                })
                .unwrap_or(0.0);
            let points = on_axis(line, axis, &step_points(&m.lines), start);
            let color = PALETTE[i % PALETTE.len()];
            out.extend(Series::smoothed(t.name.clone(), color, points, weight));
        }
        out
    });
    let zoom = RwSignal::new(None::<(f64, f64)>);
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
        <section class="card">
            <p class="crumbs"><a href="/tasks">"Tasks"</a>" / "</p>
            <h1>"Compare tasks"</h1>
            {move || match data.get() {
                None => view! { <p class="muted">"Loading…"</p> }.into_any(),
                Some(Err(e)) => view! { <p class="banner error" role="alert">{e.message}</p> }.into_any(),
                Some(Ok(l)) if l.len() < 2 => view! {
                    <p class="muted" data-testid="compare-empty">"Tick 2 to 5 tasks on the "<a href="/tasks">"task list"</a>" and choose Compare."</p>
                }.into_any(),
                Some(Ok(_)) => view! {
                    <div class="chart-controls">
                        <div class="field inline">
                            <label for="compare-metric">"Metric"</label>
                            <select id="compare-metric" data-testid="compare-metric" on:change=move |ev| { zoom.set(None); chosen.set(Some(event_target_value(&ev))); }>
                                {names().into_iter().map(|n| {
                                    let selected = n == metric();
                                    view! { <option value=n.clone() selected=selected>{n.clone()}</option> }
                                }).collect_view()}
                            </select>
                        </div>
                        <div class="field inline">
                            <label for="compare-smoothing">"Smoothing"</label>
                            <input id="compare-smoothing" type="range" min="0" max="0.99" step="0.01"
                                prop:value=move || smoothing.get().to_string()
                                on:input=move |ev| smoothing.set(event_target_value(&ev).parse().unwrap_or(0.0))/>
                        </div>
                        <span class="muted small">{move || if by_step() { "x: training step" } else { "x: time since each task started" }}</span>
                    </div>
                }.into_any(),
            }}
        </section>
        {move || (list().len() >= 2).then(|| view! {
            <section class="card">
                <LineChart title=metric() unit=unit_label(&metric()) testid="chart-compare" series x_axis=axis zoom/>
            </section>
            <section class="card">
                <h2>"What differs"</h2>
                <SpecTable tasks=list().into_iter().map(|(t, _)| t).collect()/>
            </section>
        })}
        </Transition>
    }
}

#[component]
fn SpecTable(tasks: Vec<Task>) -> impl IntoView {
    let specs: Vec<serde_json::Value> = tasks
        .iter()
        .map(|t| serde_json::to_value(&t.spec).unwrap_or_default())
        .collect();
    let diffs = plot::differences(&specs);
    view! {
        <table class="table" data-testid="compare-diff">
            <thead><tr><th>"Field"</th>{tasks.iter().map(|t| view! { <th><a href=format!("/tasks/{}", t.id)>{t.name.clone()}</a></th> }).collect_view()}</tr></thead>
            <tbody>
                <tr><td>"State"</td>{tasks.iter().map(|t| view! { <td>{state_badge(t.state)}</td> }).collect_view()}</tr>
                <tr><td>"Ran for"</td>{tasks.iter().map(|t| view! { <td>{ran_for(t).unwrap_or_else(|| "—".into())}</td> }).collect_view()}</tr>
                <tr><td>"GPU-hours"</td>{tasks.iter().map(|t| view! { <td>{format!("{:.2}", t.gpu_seconds / 3600.0)}</td> }).collect_view()}</tr>
                {diffs.into_iter().map(|(field, values)| view! {
                    <tr data-testid="diff-row"><td><code>{field}</code></td>{values.into_iter().map(|v| view! { <td>{v}</td> }).collect_view()}</tr>
                }).collect_view()}
            </tbody>
        </table>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_keep_their_order_once_each() {
        assert_eq!(ids_of(" a, b,,a ,c"), ["a", "b", "c"]);
        assert!(ids_of("").is_empty());
    }
}
