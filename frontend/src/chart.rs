//! Line charts drawn as SVG, rendered on the server with the page and live in the browser:
//! x by time, elapsed time or training step; one unit (one y axis) per chart; the values under
//! the pointer in the legend; drag to zoom, double-click to zoom out; raw lines drawn faint
//! behind smoothed ones. The arithmetic lives in [`crate::plot`].

use leptos::prelude::*;

use crate::plot::{self, XAxis};
use crate::time::{self, ViewerZone, Zone};

/// One line of a chart: (x, value) points, x ascending.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub points: Vec<(f64, f64)>,
    /// Drawn thin and pale, left out of the legend: the raw line behind a smoothed one.
    pub faint: bool,
}

impl Series {
    pub fn new(name: impl Into<String>, color: &'static str, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            color,
            points,
            faint: false,
        }
    }

    /// The line as drawn with smoothing `weight` (0: as it is): the raw line faint behind the
    /// smoothed one, so smoothing never hides what was measured.
    pub fn smoothed(
        name: impl Into<String>,
        color: &'static str,
        points: Vec<(f64, f64)>,
        weight: f64,
    ) -> Vec<Series> {
        let name = name.into();
        if weight <= 0.0 {
            return vec![Series::new(name, color, points)];
        }
        let smooth = crate::plot::smooth(&points, weight);
        vec![
            Series {
                faint: true,
                ..Series::new(name.clone(), color, points)
            },
            Series::new(name, color, smooth),
        ]
    }
}

/// Line colours: 20 that tell runs apart (the first ten strong, the next ten their lighter
/// or darker kin), for up to 20 runs compared.
pub const PALETTE: [&str; 20] = [
    "#3b5bdb", "#e8590c", "#2b8a3e", "#ae3ec9", "#c92a2a", "#1098ad", "#5c940d", "#d6336c",
    "#495057", "#f08c00", "#74c0fc", "#ffa94d", "#8ce99a", "#e599f7", "#ff8787", "#66d9e8",
    "#a9e34b", "#faa2c1", "#adb5bd", "#ffd43b",
];

const W: f64 = 720.0;
const H: f64 = 260.0;
const LEFT: f64 = 88.0;
const RIGHT: f64 = 14.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 34.0;

/// Formats an axis value with its unit.
pub fn format_value(v: f64, unit: &str) -> String {
    with_unit(plot::short_number(v), unit)
}

/// A number's text with its unit.
fn with_unit(n: String, unit: &str) -> String {
    if unit.is_empty() {
        n
    } else if unit == "%" {
        format!("{n}%")
    } else {
        format!("{n} {unit}")
    }
}

fn format_x(x: f64, axis: XAxis, zone: Zone) -> String {
    match axis {
        XAxis::Time => time::clock(x, zone),
        XAxis::Date => time::day(x),
        XAxis::Elapsed => time::duration(x),
        XAxis::Step => format!("step {}", plot::short_number(x)),
    }
}

/// A line chart. `zoom` (in x units) narrows what is shown and is set by dragging across the
/// chart; `y_max` fixes the top of the y axis (100 for percentages).
#[component]
pub fn LineChart(
    #[prop(into)] title: String,
    #[prop(into)] unit: String,
    #[prop(into)] testid: String,
    #[prop(into)] series: Signal<Vec<Series>>,
    #[prop(into, optional)] x_axis: Option<Signal<XAxis>>,
    #[prop(optional)] zoom: Option<RwSignal<Option<(f64, f64)>>>,
    #[prop(optional)] y_max: Option<f64>,
    /// The y axis starts at zero (amounts such as memory, where a cut axis would mislead).
    #[prop(optional)]
    from_zero: bool,
    /// A logarithmic y axis (losses over orders of magnitude), when every value is positive.
    #[prop(into, optional)]
    log_y: Option<Signal<bool>>,
    /// The x range shown when not zoomed: charts of one page share it, so that a moment is at
    /// the same place on each.
    #[prop(into, optional)]
    domain: Option<Signal<Option<(f64, f64)>>>,
) -> impl IntoView {
    let unit = StoredValue::new(unit);
    let x_axis = x_axis.unwrap_or_else(|| Signal::stored(XAxis::Time));
    let zone = use_context::<ViewerZone>();
    let zone = move || zone.map_or(Zone::Utc, |z| z.0.get());
    let shown = Memo::new(move |_| {
        let window = zoom.and_then(|z| z.get());
        series
            .get()
            .into_iter()
            .map(|mut s| {
                if let Some((a, b)) = window {
                    s.points.retain(|p| p.0 >= a && p.0 <= b);
                }
                s
            })
            .filter(|s| !s.points.is_empty())
            .collect::<Vec<_>>()
    });
    let count = move || {
        shown.with(|w| {
            w.iter()
                .filter(|s| !s.faint)
                .map(|s| s.points.len())
                .sum::<usize>()
        })
    };
    // The pointer (hover) and a drag in progress, in x units.
    let hover = RwSignal::new(None::<f64>);
    let drag = RwSignal::new(None::<(f64, f64)>);
    // The y axis is logarithmic when asked and every value is positive.
    let log = Memo::new(move |_| {
        log_y.is_some_and(|l| l.get())
            && shown.with(|d| d.iter().all(|s| s.points.iter().all(|p| p.1 > 0.0)))
    });
    // The drawn ranges, (x0, x1, y0, y1), y in log10 on a log axis; None when there is
    // nothing to draw.
    let geom = Memo::new(move |_| {
        let log = log.get();
        shown.with(|data| {
            if data.is_empty() {
                return None;
            }
            let (mut x0, mut x1) = (f64::MAX, f64::MIN);
            let (mut y0, mut y1) = (f64::MAX, f64::MIN);
            for s in data {
                for &(x, y) in &s.points {
                    x0 = x0.min(x);
                    x1 = x1.max(x);
                    y0 = y0.min(y);
                    y1 = y1.max(y);
                }
            }
            if let Some((a, b)) = domain.and_then(|d| d.get()) {
                (x0, x1) = (a.min(x0), b.max(x1));
            }
            if let Some((a, b)) = zoom.and_then(|z| z.get()) {
                (x0, x1) = (a, b);
            }
            if x1 <= x0 {
                x0 -= 1.0;
                x1 += 1.0;
            }
            let (y0, y1) = if log {
                plot::log_range(y0, y1)
            } else {
                let y0 = if from_zero { y0.min(0.0) } else { y0 };
                plot::y_range(y0, y1, y_max)
            };
            Some((x0, x1, y0, y1))
        })
    });
    let sx =
        move |g: (f64, f64, f64, f64), x: f64| LEFT + (x - g.0) / (g.1 - g.0) * (W - LEFT - RIGHT);
    let sy = move |g: (f64, f64, f64, f64), y: f64| {
        let y = if log.get_untracked() { y.log10() } else { y };
        TOP + (1.0 - (y - g.2) / (g.3 - g.2)) * (H - TOP - BOTTOM)
    };
    // Where a tick goes (in the axis's own values) and what it reads.
    let sy_axis = move |g: (f64, f64, f64, f64), t: f64| {
        TOP + (1.0 - (t - g.2) / (g.3 - g.2)) * (H - TOP - BOTTOM)
    };
    let to_x = move |ev: &leptos::ev::PointerEvent| {
        let (x0, x1, _, _) = geom.get_untracked()?;
        crate::live::pointer_fraction(ev).map(|f| {
            let frac = ((f * W - LEFT) / (W - LEFT - RIGHT)).clamp(0.0, 1.0);
            x0 + frac * (x1 - x0)
        })
    };
    // The axes and lines: redrawn when the data, the axis or the zoom change, never on hover
    // (the SVG element itself stays, so the pointer keeps its place on it).
    let body = move || {
        let g = geom.get()?;
        let unit = unit.get_value();
        let axis = x_axis.get();
        let zone = zone();
        let yt: Vec<(f64, f64)> = if log.get() {
            plot::log_ticks(g.2, g.3)
        } else {
            plot::nice_ticks(g.2, g.3, 4, 0.0)
                .into_iter()
                .map(|t| (t, t))
                .collect()
        };
        let grid = yt.into_iter().map(|(at, t)| {
            let y = sy_axis(g, at);
            view! {
                <line x1=LEFT x2=W - RIGHT y1=y y2=y class="grid"/>
                <text x=LEFT - 6.0 y=y + 5.0 text-anchor="end" class="tick">{format_value(t, &unit)}</text>
            }
        }).collect_view();
        // Steps are counted: round numbers of them. Times: five evenly spaced.
        let xs: Vec<f64> = if axis == XAxis::Step {
            plot::nice_ticks(g.0, g.1, 4, 1.0)
        } else {
            (0..=4)
                .map(|i| g.0 + (g.1 - g.0) * f64::from(i) / 4.0)
                .collect()
        };
        // Every other one is left out at phone width (style: .tick.minor), where they would
        // run into each other at a readable size.
        let xt = xs.into_iter().enumerate().map(|(i, x)| {
            let at = sx(g, x);
            let anchor = if at < LEFT + 30.0 { "start" } else if at > W - RIGHT - 30.0 { "end" } else { "middle" };
            let class = if i % 2 == 1 { "tick minor" } else { "tick" };
            view! { <text x=at y=H - 10.0 text-anchor=anchor class=class>{format_x(x, axis, zone)}</text> }
        }).collect_view();
        let lines = shown.with(|data| data.iter().map(|s| {
            let pts = s.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", sx(g, x), sy(g, y))).collect::<Vec<_>>().join(" ");
            let (width, opacity) = if s.faint { ("1", "0.3") } else { ("2", "1") };
            view! { <polyline points=pts fill="none" stroke=s.color stroke-width=width stroke-opacity=opacity data-line=s.name.clone()/> }
        }).collect_view());
        Some(view! {
            {grid}
            <line x1=LEFT x2=LEFT y1=TOP y2=H - BOTTOM class="axis"/>
            <line x1=LEFT x2=W - RIGHT y1=H - BOTTOM y2=H - BOTTOM class="axis"/>
            {xt}
            {lines}
        })
    };
    let marks = move || {
        let (g, hx) = (geom.get()?, hover.get()?);
        let axis = x_axis.get();
        let dots = shown.with(|data| {
            data.iter()
                .filter(|s| !s.faint)
                .filter_map(|s| {
                    plot::nearest(&s.points, hx).map(
                        |(x, y)| view! { <circle cx=sx(g, x) cy=sy(g, y) r="3.5" fill=s.color/> },
                    )
                })
                .collect_view()
        });
        Some(view! {
            <line x1=sx(g, hx) x2=sx(g, hx) y1=TOP y2=H - BOTTOM class="cursor"/>
            <text x=(sx(g, hx) + 4.0).min(W - 120.0) y=TOP + 12.0 class="tick cursor-label">{format_x(hx, axis, zone())}</text>
            {dots}
        })
    };
    let selection = move || {
        let (g, (a, b)) = (geom.get()?, drag.get()?);
        let (l, r) = (sx(g, a.min(b)), sx(g, a.max(b)));
        Some(
            view! { <rect x=l y=TOP width=(r - l).max(1.0) height=H - TOP - BOTTOM class="selection"/> },
        )
    };
    let legend = move || {
        let unit = unit.get_value();
        let at = hover.get();
        shown.with(|data| {
            let values: Vec<Option<f64>> = data.iter().filter(|s| !s.faint).map(|s| match at {
                Some(hx) => plot::nearest(&s.points, hx).map(|p| p.1),
                None => s.points.last().map(|p| p.1),
            }).collect();
            // Enough digits that runs with different values read differently.
            let digits = plot::distinct_digits(&values.iter().flatten().copied().collect::<Vec<_>>());
            data.iter().filter(|s| !s.faint).zip(values).map(|(s, value)| {
            let value = value.map(|v| with_unit(plot::significant(v, digits), &unit)).unwrap_or_default();
            view! { <span class="legend-item"><span class="swatch" style=format!("background:{}", s.color)></span>{s.name.clone()}" "<strong data-testid="legend-value">{value}</strong></span> }
        }).collect_view()
        })
    };
    view! {
        <figure class="chart" data-testid=testid data-points=move || count().to_string()>
            <figcaption>
                {title.clone()}
                <span class="muted small">{move || (x_axis.get() == XAxis::Time).then(|| format!(" · times {}", time::zone_now(zone())))}</span>
                {move || zoom.and_then(|z| z.get()).filter(|_| geom.with(Option::is_some)).map(|_| view! {
                    <button type="button" class="link small" data-testid="zoom-out" on:click=move |_| {
                        if let Some(z) = zoom { z.set(None); }
                    }>"Zoom out"</button>
                })}
            </figcaption>
            {move || geom.with(Option::is_none).then(|| view! { <p class="muted chart-empty">"No samples yet."</p> })}
            <svg viewBox=format!("0 0 {W} {H}") role="img" aria-label=title class:hidden=move || geom.with(Option::is_none)
                on:pointermove=move |ev| {
                    let x = to_x(&ev);
                    hover.set(x);
                    if let (Some(x), Some((a, _))) = (x, drag.get_untracked()) { drag.set(Some((a, x))); }
                }
                on:pointerleave=move |_| { hover.set(None); drag.set(None); }
                on:pointerdown=move |ev| {
                    if zoom.is_some() {
                        if let Some(x) = to_x(&ev) { drag.set(Some((x, x))); }
                    }
                }
                on:pointerup=move |_| {
                    if let (Some(z), Some((a, b)), Some((x0, x1, _, _))) = (zoom, drag.get_untracked(), geom.get_untracked()) {
                        // A click is no zoom: at least 2% of the width.
                        if (b - a).abs() > (x1 - x0) * 0.02 { z.set(Some((a.min(b), a.max(b)))); }
                    }
                    drag.set(None);
                }
                on:dblclick=move |_| { if let Some(z) = zoom { z.set(None); } }
            >
                {body}
                {marks}
                {selection}
            </svg>
            <div class="legend">{legend}</div>
        </figure>
    }
}

/// Colours from the best trial to the worst.
const RANKED: [&str; 5] = ["#1c7ed6", "#4dabf7", "#94a3b8", "#ffa94d", "#e8590c"];

/// Trials drawn across their parameters to their objective (parallel coordinates), coloured
/// from the best (blue) to the worst (orange); a trial's line names it when pointed at.
#[component]
pub fn ParallelChart(
    axes: Vec<plot::ParallelAxis>,
    lines: Vec<plot::ParallelLine>,
    #[prop(into)] testid: String,
) -> impl IntoView {
    const PW: f64 = 720.0;
    const PH: f64 = 300.0;
    const SIDE: f64 = 60.0;
    const PTOP: f64 = 36.0;
    const PBOTTOM: f64 = 30.0;
    let n = axes.len().max(2) - 1;
    let x = move |i: usize| SIDE + (PW - 2.0 * SIDE) * i as f64 / n as f64;
    let y = move |at: f64| PTOP + (1.0 - at) * (PH - PTOP - PBOTTOM);
    // The worst first, so the best are drawn on top.
    let mut lines = lines;
    lines.sort_by(|a, b| b.rank.total_cmp(&a.rank));
    let drawn = lines
        .into_iter()
        .map(|l| {
            let pts = l
                .at
                .iter()
                .enumerate()
                .map(|(i, a)| format!("{:.1},{:.1}", x(i), y(*a)))
                .collect::<Vec<_>>()
                .join(" ");
            let color = RANKED[((l.rank * (RANKED.len() - 1) as f64).round() as usize).min(RANKED.len() - 1)];
            view! {
                <polyline points=pts fill="none" stroke=color stroke-width="2" stroke-opacity="0.85" data-trial=l.trial>
                    <title>{format!("trial #{}", l.trial)}</title>
                </polyline>
            }
        })
        .collect_view();
    let drawn_axes = axes
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            let ax = x(i);
            let cats = if a.categories.len() > 2 {
                let k = a.categories.len() - 1;
                a.categories[1..k]
                    .iter()
                    .enumerate()
                    .map(|(j, c)| view! { <text x=ax + 6.0 y=y((j + 1) as f64 / k as f64) + 5.0 class="tick">{c.clone()}</text> })
                    .collect_view()
                    .into_any()
            } else {
                ().into_any()
            };
            view! {
                <line x1=ax x2=ax y1=y(1.0) y2=y(0.0) class="axis"/>
                <text x=ax y=18.0 text-anchor="middle" class="tick axis-name">{a.name.clone()}</text>
                <text x=ax + 6.0 y=y(1.0) + 5.0 class="tick">{a.high.clone()}</text>
                <text x=ax + 6.0 y=y(0.0) + 5.0 class="tick">{a.low.clone()}</text>
                {cats}
            }
        })
        .collect_view();
    view! {
        <figure class="chart parallel" data-testid=testid>
            <svg viewBox=format!("0 0 {PW} {PH}") role="img" aria-label="Trials across their parameters to the objective">
                {drawn}
                {drawn_axes}
            </svg>
            <figcaption class="muted small">"Each line is a trial, from its parameters to the objective: blue the best, orange the worst."</figcaption>
        </figure>
    }
}
