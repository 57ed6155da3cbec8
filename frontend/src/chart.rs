//! A small SVG line chart: time on x, a value with a unit on y, a legend, and a window of the
//! last points. It re-renders in place when its series change.

use leptos::prelude::*;

/// One line of a chart: (seconds since the epoch, value) points, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub points: Vec<(f64, f64)>,
}

pub const PALETTE: [&str; 6] = [
    "#3b5bdb", "#e8590c", "#2b8a3e", "#ae3ec9", "#c92a2a", "#1098ad",
];

const W: f64 = 640.0;
const H: f64 = 220.0;
const LEFT: f64 = 58.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 30.0;

/// Formats an axis value with its unit.
pub fn format_value(v: f64, unit: &str) -> String {
    let n = if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    if unit.is_empty() {
        n
    } else if unit == "%" {
        format!("{n}%")
    } else {
        format!("{n} {unit}")
    }
}

/// A round tick step (1, 2, 2.5 or 5 times a power of ten) at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

fn clock(secs: f64) -> String {
    let s = secs.rem_euclid(86_400.0) as u64;
    format!("{:02}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}

/// A line chart; `window` keeps only the last points of each series. `y_max` fixes the top of
/// the y axis (100 for percentages); otherwise it follows the data.
#[component]
pub fn LineChart(
    #[prop(into)] title: String,
    #[prop(into)] unit: String,
    #[prop(into)] testid: String,
    #[prop(into)] series: Signal<Vec<Series>>,
    #[prop(optional)] y_max: Option<f64>,
    #[prop(default = 120)] window: usize,
) -> impl IntoView {
    let unit = StoredValue::new(unit);
    let windowed = Memo::new(move |_| {
        series
            .get()
            .into_iter()
            .map(|mut s| {
                if s.points.len() > window {
                    s.points.drain(..s.points.len() - window);
                }
                s
            })
            .filter(|s| !s.points.is_empty())
            .collect::<Vec<_>>()
    });
    let count = move || windowed.with(|w| w.iter().map(|s| s.points.len()).sum::<usize>());
    let title2 = title.clone();
    view! {
        <figure class="chart" data-testid=testid data-points=move || count().to_string()>
            <figcaption>{title}</figcaption>
            {move || {
                let data = windowed.get();
                if data.is_empty() {
                    return view! { <p class="muted chart-empty">"No samples yet."</p> }.into_any();
                }
                let unit = unit.get_value();
                let (mut x0, mut x1) = (f64::MAX, f64::MIN);
                let (mut y0, mut y1) = (0.0f64, f64::MIN);
                for s in &data {
                    for &(x, y) in &s.points {
                        x0 = x0.min(x);
                        x1 = x1.max(x);
                        y0 = y0.min(y);
                        y1 = y1.max(y);
                    }
                }
                let y1 = match y_max {
                    Some(m) => m.max(y1),
                    None if y1 <= y0 => y0 + 1.0,
                    None => y0 + nice_step((y1 - y0) * 1.05 / 4.0) * 4.0,
                };
                if x1 <= x0 {
                    x0 -= 1.0;
                    x1 += 1.0;
                }
                let sx = move |x: f64| LEFT + (x - x0) / (x1 - x0) * (W - LEFT - RIGHT);
                let sy = move |y: f64| TOP + (1.0 - (y - y0) / (y1 - y0)) * (H - TOP - BOTTOM);
                let ticks: Vec<f64> = (0..=4).map(|i| y0 + (y1 - y0) * i as f64 / 4.0).collect();
                let grid = ticks.into_iter().map(|t| {
                    let y = sy(t);
                    view! {
                        <line x1=LEFT x2=W - RIGHT y1=y y2=y class="grid"/>
                        <text x=LEFT - 6.0 y=y + 4.0 text-anchor="end" class="tick">{format_value(t, &unit)}</text>
                    }
                }).collect_view();
                let xt = [x0, (x0 + x1) / 2.0, x1].into_iter().enumerate().map(|(i, x)| {
                    let anchor = ["start", "middle", "end"][i];
                    view! { <text x=sx(x) y=H - 8.0 text-anchor=anchor class="tick">{clock(x)}</text> }
                }).collect_view();
                let lines = data.iter().map(|s| {
                    let pts = s.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y))).collect::<Vec<_>>().join(" ");
                    let last = s.points.last().map(|&(x, y)| (sx(x), sy(y)));
                    view! {
                        <polyline points=pts fill="none" stroke=s.color stroke-width="2"/>
                        {last.map(|(x, y)| view! { <circle cx=x cy=y r="3" fill=s.color/> })}
                    }
                }).collect_view();
                let legend = data.iter().map(|s| {
                    let last = s.points.last().map(|p| format_value(p.1, &unit)).unwrap_or_default();
                    view! { <span class="legend-item"><span class="swatch" style=format!("background:{}", s.color)></span>{s.name.clone()}" "<strong>{last}</strong></span> }
                }).collect_view();
                view! {
                    <svg viewBox=format!("0 0 {W} {H}") role="img" aria-label=title2.clone()>
                        {grid}
                        <line x1=LEFT x2=LEFT y1=TOP y2=H - BOTTOM class="axis"/>
                        <line x1=LEFT x2=W - RIGHT y1=H - BOTTOM y2=H - BOTTOM class="axis"/>
                        {xt}
                        {lines}
                    </svg>
                    <div class="legend">{legend}</div>
                }.into_any()
            }}
        </figure>
    }
}
