//! A task's charts: its whole history from the server (thinned so a long run keeps its shape),
//! new samples appended live, a chart per unit (GPU utilization, GPU memory) and one per
//! number the task reports, each GPU its own line, x by time or by step, smoothing and zoom.
//! A zoom by time asks the server for that window in full detail.

use std::collections::BTreeSet;

use autodl_common::metrics::{
    self, is_gpu_line, per_gpu, unit_of, MetricLine, MetricLines, MetricUnit, PerGpu,
    GPU_MEM_TOTAL, GPU_MEM_USED, GPU_UTIL,
};
use autodl_common::tasks::MetricSample;
use leptos::prelude::*;

use super::tasks::encode;
use crate::api;
use crate::chart::{LineChart, Series, PALETTE};
use crate::fields::ShownToggle;
use crate::live::{self, TailStatus};
use crate::paths;
use crate::plot::{self, XAxis};
use crate::time;

/// Prefixes naming the split a number was measured on: `loss` and `val_loss`, or `train/acc`
/// and `val/acc`, are drawn in one panel.
const SPLITS: [&str; 7] = [
    "train",
    "training",
    "val",
    "valid",
    "validation",
    "eval",
    "test",
];

/// Counters: a run's progress, read as a value (and used as the x axis), not drawn.
const COUNTERS: [&str; 5] = ["step", "epoch", "global_step", "iteration", "iter"];

/// What a reported number is, without the split it was measured on.
pub fn stem(name: &str) -> &str {
    for sep in ['/', '_'] {
        if let Some((pre, rest)) = name.split_once(sep) {
            if SPLITS.contains(&pre) && !rest.is_empty() {
                return rest;
            }
        }
    }
    name
}

/// One chart of reported numbers: those of one stem, each a line.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Panel {
    pub title: String,
    pub members: Vec<String>,
}

/// The panels of `names` (in their order), a stem's numbers together.
pub fn panels(names: &[String]) -> Vec<Panel> {
    let mut out: Vec<Panel> = Vec::new();
    for n in names {
        let key = stem(n);
        match out
            .iter_mut()
            .find(|p| p.members.iter().any(|m| stem(m) == key))
        {
            Some(p) => {
                p.members.push(n.clone());
                p.title = key.to_owned();
            }
            None => out.push(Panel {
                title: n.clone(),
                members: vec![n.clone()],
            }),
        }
    }
    out
}

/// A counter, or a number that never changed (a learning rate held constant): read as its
/// value rather than drawn as a flat line.
pub fn as_value(line: &MetricLine) -> bool {
    COUNTERS.contains(&line.name.as_str())
        || line
            .points
            .first()
            .is_some_and(|f| line.points.iter().all(|p| p[1] == f[1]))
}

/// Points per line asked of the server, and kept per line for drawing.
const POINTS: usize = 400;
/// Live points kept per line before the oldest are thinned away.
const LIVE_POINTS: usize = 5000;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// History then live points: live points newer than a line's history are appended (the
/// stream and the history overlap where they meet), within the window when zoomed.
pub fn merge(
    mut base: Vec<MetricLine>,
    live: &[MetricLine],
    window: Option<(f64, f64)>,
) -> Vec<MetricLine> {
    for l in live {
        let fresh = |last: Option<f64>| {
            l.points
                .iter()
                .filter(move |p| last.is_none_or(|t| p[0] > t))
                .filter(move |p| window.is_none_or(|(a, b)| p[0] >= a && p[0] <= b))
                .copied()
        };
        match base.iter_mut().find(|b| b.name == l.name) {
            Some(b) => {
                let last = b.points.last().map(|p| p[0]);
                let more: Vec<[f64; 2]> = fresh(last).collect();
                b.points.extend(more);
            }
            None => {
                let points: Vec<[f64; 2]> = fresh(None).collect();
                if !points.is_empty() {
                    base.push(MetricLine {
                        name: l.name.clone(),
                        points,
                    });
                }
            }
        }
    }
    for b in &mut base {
        if b.points.len() > POINTS * 3 {
            b.points = metrics::thin(&b.points, POINTS * 2);
        }
    }
    metrics::sort_lines(&mut base);
    base
}

/// A line's points on the chosen x axis, values scaled to the chart's unit.
pub fn on_axis(
    line: &MetricLine,
    axis: XAxis,
    steps: &[(f64, f64)],
    start_ms: f64,
) -> Vec<(f64, f64)> {
    let scale = match unit_of(&line.name) {
        MetricUnit::Fraction => 100.0,
        MetricUnit::Bytes => 1.0 / GIB,
        MetricUnit::Reported => 1.0,
    };
    let points: Vec<(f64, f64)> = line.points.iter().map(|p| (p[0], p[1] * scale)).collect();
    match axis {
        XAxis::Time | XAxis::Date => points,
        XAxis::Elapsed => points
            .into_iter()
            .map(|(t, v)| ((t - start_ms) / 1000.0, v))
            .collect(),
        XAxis::Step => plot::by_step(&points, steps),
    }
}

/// The unit a chart of this line is drawn in.
pub fn unit_label(name: &str) -> &'static str {
    match unit_of(name) {
        MetricUnit::Fraction => "%",
        MetricUnit::Bytes => "GiB",
        MetricUnit::Reported => "",
    }
}

/// The `(time, step)` points of the task's `step` line.
pub fn step_points(lines: &[MetricLine]) -> Vec<(f64, f64)> {
    lines
        .iter()
        .find(|l| l.name == "step")
        .map(|l| l.points.iter().map(|p| (p[0], p[1])).collect())
        .unwrap_or_default()
}

/// A task's chart history and the view choices that decide which window of it to read. Made
/// where the page's other resources are (never inside a view closure: a resource made there is
/// made again each time the server re-renders the closure, and fetched again, forever).
#[derive(Clone, Copy)]
pub struct ChartHistory {
    axis: RwSignal<XAxis>,
    zoom: RwSignal<Option<(f64, f64)>>,
    /// Only a zoom by time asks the server for a window; by step it narrows what is drawn.
    window: Memo<Option<(f64, f64)>>,
    lines: Resource<Result<MetricLines, api::ApiErr>>,
    tid: StoredValue<String>,
}

impl ChartHistory {
    pub fn new(id: &str) -> Self {
        let tid = StoredValue::new(id.to_owned());
        let axis = RwSignal::new(XAxis::Time);
        let zoom = RwSignal::new(None::<(f64, f64)>);
        let window = Memo::new(move |_| (axis.get() == XAxis::Time).then(|| zoom.get()).flatten());
        let lines = Resource::new(
            move || window.get().map(|(a, b)| (a.to_bits(), b.to_bits())),
            move |w| {
                let mut path = format!(
                    "{}?points={POINTS}",
                    paths::task_metric_lines(&tid.get_value())
                );
                if let Some((a, b)) = w {
                    let (a, b) = (f64::from_bits(a), f64::from_bits(b));
                    path.push_str(&format!(
                        "&from={}&to={}",
                        encode(&time::iso(a)),
                        encode(&time::iso(b))
                    ));
                }
                async move { api::get::<MetricLines>(&path).await }
            },
        );
        ChartHistory {
            axis,
            zoom,
            window,
            lines,
            tid,
        }
    }
}

#[component]
pub fn Metrics(history: ChartHistory) -> impl IntoView {
    let ChartHistory {
        axis,
        zoom,
        window,
        lines: history,
        tid,
    } = history;
    let smoothing = RwSignal::new(0.0f64);
    let per_gpu_lines = RwSignal::new(true);
    let hidden = RwSignal::new(BTreeSet::<String>::new());
    let live_lines = RwSignal::new(Vec::<MetricLine>::new());
    let status = RwSignal::new(TailStatus::Connecting);
    // Pushed by the server as they arrive; a dropped stream resumes after the last sample.
    let url = move || {
        let after = live_lines.with_untracked(|l| {
            l.iter()
                .filter_map(|l| l.points.last().map(|p| p[0]))
                .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))))
        });
        match after {
            Some(ms) => format!(
                "{}?after={}",
                paths::task_metric_stream(&tid.get_value()),
                encode(&time::iso(ms))
            ),
            None => paths::task_metric_stream(&tid.get_value()),
        }
    };
    live::follow(
        url,
        move |s: MetricSample| {
            let Some(ms) = time::parse_ms(&s.at) else {
                return;
            };
            live_lines.update(|lines| {
                metrics::append_sample(lines, ms, &s);
                for l in lines.iter_mut() {
                    if l.points.len() > LIVE_POINTS {
                        l.points = metrics::thin(&l.points, LIVE_POINTS / 2);
                    }
                }
            })
        },
        status,
    );
    let lines = Memo::new(move |_| {
        let base = history
            .get()
            .and_then(|r| r.ok())
            .map(|h| h.lines)
            .unwrap_or_default();
        let window = window.get();
        live_lines.with(|live| merge(base, live, window))
    });
    let steps = Memo::new(move |_| lines.with(|l| step_points(l)));
    let has_steps = move || steps.with(|s| s.len() > 1);
    let reported = Memo::new(move |_| {
        lines.with(|l| {
            l.iter()
                .filter(|l| !is_gpu_line(&l.name) && !as_value(l))
                .map(|l| l.name.clone())
                .collect::<Vec<_>>()
        })
    });
    // Counters and constants, with their latest value.
    let values = Memo::new(move |_| {
        lines.with(|l| {
            l.iter()
                .filter(|l| !is_gpu_line(&l.name) && as_value(l))
                .filter_map(|l| l.points.last().map(|p| (l.name.clone(), p[1])))
                .collect::<Vec<_>>()
        })
    });
    let log_y = RwSignal::new(false);
    // The series of the named lines, in the chart's unit, on the chosen axis.
    let series_of = move |pick: &dyn Fn(&str) -> Option<String>, smooth: bool| {
        let axis = axis.get();
        let weight = if smooth { smoothing.get() } else { 0.0 };
        let steps = steps.get();
        lines.with(|lines| {
            let mut out = Vec::new();
            let picked = lines.iter().filter_map(|l| pick(&l.name).map(|n| (n, l)));
            for (i, (label, line)) in picked.enumerate() {
                let color = PALETTE[i % PALETTE.len()];
                let points = on_axis(line, axis, &steps, 0.0);
                out.extend(Series::smoothed(label, color, points, weight));
            }
            out
        })
    };
    let gpu_label = |name: &str, kind: PerGpu, show: bool| -> Option<String> {
        per_gpu(name)
            .filter(|(_, k)| *k == kind && show)
            .map(|(i, _)| format!("GPU {i}"))
    };
    // Lines of single GPUs, only where there is more than one (one GPU's line is the mean).
    let gpus = Memo::new(move |_| {
        lines.with(|l| {
            l.iter()
                .filter(|l| per_gpu(&l.name).is_some_and(|(_, k)| k == PerGpu::Util))
                .count()
        })
    });
    let util = Signal::derive(move || {
        let each = per_gpu_lines.get() && gpus.get() > 1;
        series_of(
            &|n| {
                if n == GPU_UTIL {
                    Some("all GPUs (mean)".into())
                } else {
                    gpu_label(n, PerGpu::Util, each)
                }
            },
            false,
        )
    });
    let mem = Signal::derive(move || {
        let each = per_gpu_lines.get() && gpus.get() > 1;
        series_of(
            &|n| match n {
                GPU_MEM_USED => Some("used (all GPUs)".into()),
                GPU_MEM_TOTAL => Some("installed".into()),
                _ => gpu_label(n, PerGpu::Mem, each),
            },
            false,
        )
    });
    let x_axis = Signal::derive(move || axis.get());
    // One x range for every chart of the page: GPU samples and reported numbers cover
    // different spans, and a moment should be at the same place on each.
    let domain = Memo::new(move |_| {
        let axis = axis.get();
        let steps = steps.get();
        lines.with(|lines| {
            lines
                .iter()
                .flat_map(|l| on_axis(l, axis, &steps, 0.0))
                .fold(None, |r: Option<(f64, f64)>, (x, _)| {
                    Some(r.map_or((x, x), |(a, b)| (a.min(x), b.max(x))))
                })
        })
    });
    view! {
        <div class="chart-controls" data-testid="chart-controls">
            <div class="field inline">
                <label for="metrics-x">"x axis"</label>
                <select id="metrics-x" data-testid="metrics-x" on:change=move |ev| {
                    zoom.set(None);
                    axis.set(if event_target_value(&ev) == "step" { XAxis::Step } else { XAxis::Time });
                }>
                    <option value="time" selected=move || axis.get() == XAxis::Time>"time"</option>
                    <option value="step" selected=move || axis.get() == XAxis::Step disabled=move || !has_steps()>"step"</option>
                </select>
            </div>
            <div class="field inline">
                <label for="metrics-smoothing">"Smoothing"</label>
                <input id="metrics-smoothing" data-testid="metrics-smoothing" type="range" min="0" max="0.99" step="0.01"
                    prop:value=move || smoothing.get().to_string()
                    on:input=move |ev| smoothing.set(event_target_value(&ev).parse().unwrap_or(0.0))/>
                <span class="small muted">{move || format!("{:.2}", smoothing.get())}</span>
            </div>
            <label class="check"><input type="checkbox" data-testid="metrics-per-gpu" bind:checked=per_gpu_lines/>" Each GPU"</label>
            <label class="check"><input type="checkbox" data-testid="metrics-log" bind:checked=log_y/>" Log scale"</label>
            <span class="muted small">"Drag across a chart to zoom, double-click to zoom out. Stream: "
                <span data-testid="metrics-status">{move || status.get().label()}</span></span>
        </div>
        {move || (!reported.get().is_empty()).then(|| view! {
            <fieldset class="metric-picker">
                <legend>"Reported metrics"</legend>
                {reported.get().into_iter().map(|name| view! {
                    <ShownToggle testid=format!("metric-toggle-{name}") name hidden/>
                }).collect_view()}
            </fieldset>
        })}
        {move || (!values.get().is_empty()).then(|| view! {
            <dl class="metric-values" data-testid="metric-values">
                {values.get().into_iter().map(|(name, v)| view! {
                    <div data-testid=format!("metric-value-{name}")><dt>{name.clone()}</dt><dd>{plot::significant(v, 6)}</dd></div>
                }).collect_view()}
            </dl>
        })}
        <div class="charts">
            <LineChart title="GPU utilization" unit="%" testid="chart-util" series=util x_axis zoom y_max={100.0} domain/>
            <LineChart title="GPU memory" unit="GiB" testid="chart-mem" series=mem x_axis zoom from_zero=true domain/>
            <For
                each=move || {
                    let shown: Vec<String> = reported.get().into_iter().filter(|n| hidden.with(|h| !h.contains(n))).collect();
                    panels(&shown)
                }
                key=|p| p.clone()
                children=move |panel: Panel| {
                    let members = panel.members.clone();
                    let series = Signal::derive(move || series_of(&|l| members.iter().any(|m| m == l).then(|| l.to_owned()), true));
                    let title = panel.title.clone();
                    view! { <LineChart title=title.clone() unit="" testid=format!("chart-metric-{title}") series x_axis zoom log_y domain/> }
                }
            />
        </div>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(name: &str, points: &[(f64, f64)]) -> MetricLine {
        MetricLine {
            name: name.into(),
            points: points.iter().map(|&(x, y)| [x, y]).collect(),
        }
    }

    #[test]
    fn numbers_of_one_kind_share_a_panel_and_counters_read_as_values() {
        let names: Vec<String> = [
            "accuracy",
            "loss",
            "train/acc",
            "val/acc",
            "val_loss",
            "lr_decay",
        ]
        .map(String::from)
        .to_vec();
        let p = panels(&names);
        let got: Vec<(&str, Vec<&str>)> = p
            .iter()
            .map(|p| {
                (
                    p.title.as_str(),
                    p.members.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("accuracy", vec!["accuracy"]),
                ("loss", vec!["loss", "val_loss"]),
                ("acc", vec!["train/acc", "val/acc"]),
                ("lr_decay", vec!["lr_decay"]),
            ]
        );
        assert!(as_value(&line("step", &[(1.0, 1.0), (2.0, 2.0)])));
        assert!(as_value(&line("lr", &[(1.0, 0.1), (2.0, 0.1)])));
        assert!(!as_value(&line("loss", &[(1.0, 0.3), (2.0, 0.2)])));
    }

    #[test]
    fn live_points_extend_the_history_without_repeating_it() {
        let base = vec![line("loss", &[(1.0, 3.0), (2.0, 2.0)])];
        let live = vec![
            line("loss", &[(2.0, 2.0), (3.0, 1.0)]),
            line("accuracy", &[(3.0, 0.5)]),
        ];
        let merged = merge(base.clone(), &live, None);
        assert_eq!(
            merged[1],
            line("loss", &[(1.0, 3.0), (2.0, 2.0), (3.0, 1.0)])
        );
        assert_eq!(merged[0], line("accuracy", &[(3.0, 0.5)]));
        // Zoomed into the past: the live points stay out of the window.
        let zoomed = merge(base, &live, Some((0.0, 2.5)));
        assert_eq!(zoomed.len(), 1);
        assert_eq!(zoomed[0].points.len(), 2);
    }

    #[test]
    fn lines_are_drawn_in_their_unit() {
        let util = line("gpu0_util", &[(1000.0, 0.5)]);
        assert_eq!(on_axis(&util, XAxis::Time, &[], 0.0), vec![(1000.0, 50.0)]);
        let mem = line("gpu_mem_used", &[(3000.0, GIB * 2.0)]);
        assert_eq!(on_axis(&mem, XAxis::Elapsed, &[], 1000.0), vec![(2.0, 2.0)]);
        assert_eq!(unit_label("gpu_mem_total"), "GiB");
        assert_eq!(unit_label("accuracy"), "");
    }
}
