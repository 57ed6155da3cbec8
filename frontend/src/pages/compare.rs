//! Two to twenty tasks side by side (`/compare?ids=a,b`): one metric of each on one chart, by
//! step when they all report steps (else by time since each started), a table of the runs
//! (what differs in their specs, and the latest of each number they report; sorted by any
//! column, the columns shown kept), and what differs between their specs, so a researcher
//! sees which change made which curve.

use autodl_common::metrics::{is_gpu_line, MetricLines, GPU_UTIL};
use autodl_common::tasks::Task;
use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use super::metrics::{on_axis, step_points, unit_label};
use super::tasks::{ran_for, state_badge};
use crate::api::{self, ApiErr};
use crate::chart::{LineChart, Series, PALETTE};
use crate::fields::ShownToggle;
use crate::paths;
use crate::plot::{self, XAxis};
use crate::session::RequireLogin;
use crate::time;

/// At most this many tasks on one chart.
pub const MAX_COMPARED: usize = 20;

/// Where the columns a person hid are kept.
const HIDDEN_COLUMNS: &str = "autodl.compare.hidden";

/// One cell of the runs table: what it reads and how it sorts (numbers by value).
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub text: String,
    pub number: Option<f64>,
}

/// A task's row of the runs table.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    pub id: String,
    /// `#N name`.
    pub name: String,
    pub cells: Vec<Cell>,
}

/// The runs table: its column names and a row per task. Columns: state, GPU-hours, each
/// spec field that differs among them, the latest value of each number they report.
pub fn runs_table(runs: &[(Task, MetricLines)]) -> (Vec<String>, Vec<RunRow>) {
    let specs: Vec<serde_json::Value> = runs
        .iter()
        .map(|(t, _)| serde_json::to_value(&t.spec).unwrap_or_default())
        .collect();
    // The name is the row's own.
    let diffs: Vec<_> = plot::differences(&specs)
        .into_iter()
        .filter(|(f, _)| f != "name")
        .collect();
    let mut reported: Vec<String> = runs
        .iter()
        .flat_map(|(_, l)| {
            l.lines
                .iter()
                .filter(|l| !is_gpu_line(&l.name))
                .map(|l| l.name.clone())
        })
        .collect();
    reported.sort();
    reported.dedup();
    let mut columns = vec!["state".to_string(), "GPU-h".into()];
    columns.extend(diffs.iter().map(|(f, _)| f.clone()));
    columns.extend(reported.iter().cloned());
    let latest: Vec<Vec<Option<f64>>> = runs
        .iter()
        .map(|(_, l)| {
            reported
                .iter()
                .map(|n| {
                    l.lines
                        .iter()
                        .find(|x| &x.name == n)
                        .and_then(|x| x.points.last().map(|p| p[1]))
                })
                .collect()
        })
        .collect();
    // Per number, enough digits that the runs read differently.
    let digits: Vec<usize> = (0..reported.len())
        .map(|j| plot::distinct_digits(&latest.iter().filter_map(|r| r[j]).collect::<Vec<_>>()))
        .collect();
    let rows = runs
        .iter()
        .enumerate()
        .map(|(i, (t, _))| {
            let mut cells = vec![
                Cell {
                    text: t.state.as_str().to_owned(),
                    number: None,
                },
                Cell {
                    text: format!("{:.2}", t.gpu_seconds / 3600.0),
                    number: Some(t.gpu_seconds / 3600.0),
                },
            ];
            cells.extend(diffs.iter().map(|(_, values)| Cell {
                number: values[i].parse().ok(),
                text: values[i].clone(),
            }));
            cells.extend(latest[i].iter().zip(&digits).map(|(v, d)| {
                Cell {
                    text: v
                        .map(|v| plot::significant(v, *d))
                        .unwrap_or_else(|| "—".into()),
                    number: *v,
                }
            }));
            RunRow {
                id: t.id.clone(),
                name: format!("#{} {}", t.number, t.name),
                cells,
            }
        })
        .collect();
    (columns, rows)
}

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
    // Fetched in the browser: as a server-rendered resource, a page loaded directly failed
    // to hydrate (the browser read another value than the server drew).
    let data = LocalResource::new(move || {
        let ids = ids.get();
        async move {
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
        }
    });
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
        <section class="card">
            <p class="crumbs"><a href="/tasks">"Tasks"</a>" / "</p>
            <h1>"Compare tasks"</h1>
            {move || match data.get() {
                None => view! { <p class="muted">"Loading…"</p> }.into_any(),
                Some(Err(e)) => view! { <p class="banner error" role="alert">{e.message}</p> }.into_any(),
                Some(Ok(l)) if l.len() < 2 => view! {
                    <p class="muted" data-testid="compare-empty">"Tick 2 to 20 tasks on the "<a href="/tasks">"task list"</a>" and choose Compare."</p>
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
                <h2>"Runs"</h2>
                <RunsTable runs=list()/>
            </section>
            <section class="card">
                <h2>"What differs"</h2>
                <SpecTable tasks=list().into_iter().map(|(t, _)| t).collect()/>
            </section>
        })}
    }
}

/// The runs, a row each, sorted by a click on a column's name (again: the other way); the
/// columns shown are chosen below it and kept in this browser.
#[component]
fn RunsTable(runs: Vec<(Task, MetricLines)>) -> impl IntoView {
    let (columns, rows) = runs_table(&runs);
    let columns = StoredValue::new(columns);
    let rows = StoredValue::new(rows);
    let sort = RwSignal::new(None::<(usize, bool)>);
    // Read from this browser once the page is live (the server's page shows every column,
    // and hydration must find what it drew), saved on every change after.
    let hidden = RwSignal::new(std::collections::BTreeSet::<String>::new());
    let loaded = StoredValue::new(false);
    Effect::new(move |_| {
        let h = hidden.with(|h| h.iter().cloned().collect::<Vec<_>>().join("\n"));
        if !loaded.get_value() {
            loaded.set_value(true);
            if let Some(saved) = crate::live::load_local(HIDDEN_COLUMNS) {
                hidden.set(
                    saved
                        .split('\n')
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect(),
                );
            }
            return;
        }
        crate::live::save_local(HIDDEN_COLUMNS, &h);
    });
    let shown = move || {
        columns.with_value(|c| {
            c.iter()
                .enumerate()
                .filter(|(_, name)| hidden.with(|h| !h.contains(*name)))
                .map(|(i, name)| (i, name.clone()))
                .collect::<Vec<_>>()
        })
    };
    let ordered = move || {
        let mut r = rows.get_value();
        if let Some((col, asc)) = sort.get() {
            r.sort_by(|a, b| {
                let (x, y) = (&a.cells[col], &b.cells[col]);
                let o = match (x.number, y.number) {
                    (Some(p), Some(q)) => p.total_cmp(&q),
                    (Some(_), None) => std::cmp::Ordering::Less,
                    (None, Some(_)) => std::cmp::Ordering::Greater,
                    (None, None) => x.text.cmp(&y.text),
                };
                if asc {
                    o
                } else {
                    o.reverse()
                }
            });
        }
        r
    };
    view! {
        <div class="table-scroll">
        <table class="table runs" data-testid="runs-table">
            <thead><tr>
                <th>"Run"</th>
                {move || shown().into_iter().map(|(i, name)| {
                    let arrow = move || match sort.get() {
                        Some((c, true)) if c == i => " ↑",
                        Some((c, false)) if c == i => " ↓",
                        _ => "",
                    };
                    view! {
                        <th><button type="button" class="link" data-testid=format!("sort-{name}")
                            on:click=move |_| sort.update(|s| *s = Some(match *s { Some((c, asc)) if c == i => (i, !asc), _ => (i, true) }))>
                            {name.clone()}<span class="sort-arrow">{arrow}</span></button></th>
                    }
                }).collect_view()}
            </tr></thead>
            <tbody>
                {move || ordered().into_iter().map(|RunRow { id, name, cells }| {
                    let shown = shown();
                    view! {
                        <tr data-testid="run-row"><td><a href=format!("/tasks/{id}")>{name}</a></td>
                            {shown.into_iter().map(|(i, _)| view! { <td class="num">{cells[i].text.clone()}</td> }).collect_view()}
                        </tr>
                    }
                }).collect_view()}
            </tbody>
        </table>
        </div>
        <details class="columns">
            <summary>"Columns"</summary>
            {columns.get_value().into_iter().map(|name| view! {
                <ShownToggle testid=format!("column-{name}") name hidden/>
            }).collect_view()}
        </details>
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
        <div class="table-scroll">
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
        </div>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runs_table_has_what_differs_and_the_latest_of_each_number() {
        use autodl_common::metrics::MetricLine;
        let task = |id: &str, n: u64, lr: &str, loss: f64| {
            let spec = serde_json::json!({"name": id, "image": "img", "command": ["python"], "env": {"LR": lr},
                "gpu_types": [], "gpus_per_worker": 1, "gpu_memory": null, "cpu": 1.0, "memory": 1,
                "num_workers": 1, "priority": 0.5, "deadline": null, "estimated_runtime": null,
                "checkpoint": null, "retry_policy": {"max_retries": 0, "oom_recovery": false},
                "zone_affinity": false, "bandwidth": "normal", "data_path": null, "labels": {},
                "batch_size": null, "preemptible": true});
            let t: Task = serde_json::from_value(serde_json::json!({"id": id, "number": n, "name": id,
                "state": "completed", "user_id": "u", "user_email": "u@x", "tenant_id": "t", "spec": spec,
                "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z", "attempts": 1,
                "batch_size": null, "placement": null, "waiting": null, "gpu_seconds": 7200.0}))
            .unwrap();
            let lines = MetricLines {
                lines: vec![
                    MetricLine {
                        name: "loss".into(),
                        points: vec![[1.0, 0.9], [2.0, loss]],
                    },
                    MetricLine {
                        name: "gpu_util".into(),
                        points: vec![[1.0, 0.5]],
                    },
                ],
                raw_points: 3,
                truncated: false,
            };
            (t, lines)
        };
        let (columns, rows) =
            runs_table(&[task("a", 1, "0.1", 0.2345), task("b", 2, "0.01", 0.2349)]);
        assert_eq!(columns, ["state", "GPU-h", "env.LR", "loss"]);
        assert_eq!(rows[0].name, "#1 a");
        let texts: Vec<&str> = rows[0].cells.iter().map(|c| c.text.as_str()).collect();
        // As many digits as tell the two losses apart.
        assert_eq!(texts, ["completed", "2.00", "0.1", "0.234"]);
        assert_eq!(rows[1].cells[3].text, "0.235");
        assert_eq!(rows[1].cells[3].number, Some(0.2349));
    }

    #[test]
    fn ids_keep_their_order_once_each() {
        assert_eq!(ids_of(" a, b,,a ,c"), ["a", "b", "c"]);
        assert!(ids_of("").is_empty());
    }
}
