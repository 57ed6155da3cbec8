//! The arithmetic behind the charts, apart from drawing so it can be tested: axis ranges and
//! ticks, the point nearest the pointer, smoothing, x by training step, and what differs
//! between the specs of tasks compared.

use std::collections::BTreeMap;

use serde_json::Value;

/// What the x axis counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAxis {
    /// Milliseconds since the epoch, shown as the viewer's clock.
    Time,
    /// Milliseconds since the epoch of UTC days (or weeks, months), shown as dates.
    Date,
    /// Seconds since the run started (tasks compared side by side).
    Elapsed,
    /// The training step the task reported.
    Step,
}

/// A number in few characters: `1234`, `12.3`, `0.123`, `1.2e-5`.
pub fn short_number(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        "0".into()
    } else if !(1e-3..1e6).contains(&a) {
        format!("{v:.2e}")
    } else if a >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// `v` with `digits` significant digits, trailing zeros dropped: `0.01234` at 3 is `0.0123`.
pub fn significant(v: f64, digits: usize) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v == 0.0 { "0".into() } else { v.to_string() };
    }
    let a = v.abs();
    if !(1e-4..1e7).contains(&a) {
        let s = format!("{v:.*e}", digits.saturating_sub(1));
        return s;
    }
    let magnitude = a.log10().floor() as i32;
    let decimals = (digits as i32 - 1 - magnitude).max(0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// The fewest significant digits (3 to 8) at which values that differ are shown differently:
/// runs whose losses differ in the fourth digit must not all read `0.0100`.
pub fn distinct_digits(values: &[f64]) -> usize {
    let mut distinct: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    distinct.sort_by(f64::total_cmp);
    distinct.dedup();
    (3..=8)
        .find(|d| {
            let shown: std::collections::BTreeSet<String> =
                distinct.iter().map(|v| significant(*v, *d)).collect();
            shown.len() == distinct.len()
        })
        .unwrap_or(8)
}

/// A round step (1, 2, 2.5 or 5 times a power of ten) at least `raw`.
pub fn nice_step(raw: f64) -> f64 {
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

/// The y axis for data in `[lo, hi]`: round ends, zero included when the data sits near it
/// (so a small change never looks like a cliff), `y_max` as the top when given.
pub fn y_range(lo: f64, hi: f64, y_max: Option<f64>) -> (f64, f64) {
    if let Some(top) = y_max {
        return (lo.min(0.0), top.max(hi));
    }
    let (mut lo, hi) = (lo, hi);
    if lo >= 0.0 && lo < hi * 0.5 {
        lo = 0.0;
    }
    if hi <= lo {
        let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        return (lo - pad, hi + pad);
    }
    let step = nice_step((hi - lo) * 1.05 / 4.0);
    let bottom = (lo / step).floor() * step;
    let mut top = (hi / step).ceil() * step;
    if top <= bottom {
        top = bottom + step;
    }
    (bottom, top)
}

/// Ticks at the round multiples (1, 2, 2.5, 5 times a power of ten) within `[lo, hi]`, about
/// `n` steps apart: `0, 0.05, 0.1, 0.15` rather than `0, 0.0375, 0.075, ...`. `min_step`
/// keeps counts whole (steps of a training run).
pub fn nice_ticks(lo: f64, hi: f64, n: u32, min_step: f64) -> Vec<f64> {
    if hi <= lo || !lo.is_finite() || !hi.is_finite() {
        return vec![lo];
    }
    let step = nice_step((hi - lo) / f64::from(n.max(1))).max(min_step);
    let eps = step * 1e-9;
    let first = (lo / step - 1e-9).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    // Rounded to the step's digits: 3 x 0.05 is 0.15, not 0.15000000000000002.
    let scale = 10f64.powi((2 - step.log10().floor() as i32).max(0));
    (first..=last)
        .take(50)
        .map(|k| {
            let v = (k as f64 * step * scale).round() / scale;
            // -0 and 1e-17 read as 0.
            if v.abs() < eps {
                0.0
            } else {
                v
            }
        })
        .collect()
}

/// The log10 range of positive data in `[lo, hi]`: whole decades around it.
pub fn log_range(lo: f64, hi: f64) -> (f64, f64) {
    let (a, b) = (lo.log10().floor(), hi.log10().ceil());
    if b > a {
        (a, b)
    } else {
        (a, a + 1.0)
    }
}

/// Ticks of a log axis over `[lo, hi]` (log10 values), as (position, value): each decade,
/// with its 2 and 5 when the axis spans few decades.
pub fn log_ticks(lo: f64, hi: f64) -> Vec<(f64, f64)> {
    let decades = (lo.floor() as i64)..=(hi.ceil() as i64);
    let fine = hi - lo <= 2.0;
    let mut out = Vec::new();
    for e in decades.take(40) {
        for m in if fine {
            &[1.0, 2.0, 5.0][..]
        } else {
            &[1.0][..]
        } {
            let v = m * 10f64.powi(e as i32);
            let t = v.log10();
            if t >= lo - 1e-9 && t <= hi + 1e-9 {
                out.push((t, v));
            }
        }
    }
    out
}

/// The point whose x is nearest `x` (points ascending by x).
pub fn nearest(points: &[(f64, f64)], x: f64) -> Option<(f64, f64)> {
    let i = points.partition_point(|p| p.0 < x);
    let after = points.get(i);
    let before = i.checked_sub(1).and_then(|j| points.get(j));
    match (before, after) {
        (Some(b), Some(a)) => Some(if x - b.0 <= a.0 - x { *b } else { *a }),
        (Some(p), None) | (None, Some(p)) => Some(*p),
        (None, None) => None,
    }
}

/// Exponential moving average with its start-up bias removed (as TensorBoard smooths), so
/// the smoothed line starts where the data starts. `weight` in `[0, 1)`; 0 leaves it as is.
pub fn smooth(points: &[(f64, f64)], weight: f64) -> Vec<(f64, f64)> {
    let w = weight.clamp(0.0, 0.999);
    if w == 0.0 {
        return points.to_vec();
    }
    let mut last = 0.0;
    let mut debias = 1.0;
    points
        .iter()
        .map(|&(x, y)| {
            last = last * w + (1.0 - w) * y;
            debias *= w;
            (x, last / (1.0 - debias))
        })
        .collect()
}

/// Re-expresses time-stamped points by training step: each point's time is placed between
/// the step reports around it. Points before the first report or after the last are left
/// out (their step is not known). `steps` holds `(time, step)` ascending by time.
pub fn by_step(points: &[(f64, f64)], steps: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let (Some(first), Some(last)) = (steps.first(), steps.last()) else {
        return Vec::new();
    };
    let mut out: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p.0 >= first.0 && p.0 <= last.0)
        .filter_map(|&(t, y)| {
            let i = steps.partition_point(|s| s.0 < t);
            let step = match (i.checked_sub(1).map(|j| steps[j]), steps.get(i)) {
                (_, Some(a)) if a.0 == t => a.1,
                (Some(b), Some(a)) => b.1 + (a.1 - b.1) * (t - b.0) / (a.0 - b.0),
                (Some(b), None) => b.1,
                (None, Some(a)) => a.1,
                (None, None) => return None,
            };
            Some((step, y))
        })
        .collect();
    // A restarted run reports its steps again: keep x ascending for drawing.
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// Each field of a task spec as `dotted.path → text`.
pub fn flatten(spec: &Value) -> BTreeMap<String, String> {
    fn walk(prefix: &str, v: &Value, out: &mut BTreeMap<String, String>) {
        match v {
            Value::Object(map) if !map.is_empty() => {
                for (k, v) in map {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&path, v, out);
                }
            }
            Value::Null => {}
            Value::String(s) => {
                out.insert(prefix.to_owned(), s.clone());
            }
            other => {
                out.insert(prefix.to_owned(), other.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", spec, &mut out);
    out
}

/// The fields on which these specs differ, each with every spec's value ("—" where unset).
pub fn differences(specs: &[Value]) -> Vec<(String, Vec<String>)> {
    let flat: Vec<BTreeMap<String, String>> = specs.iter().map(flatten).collect();
    let mut keys: Vec<&String> = flat.iter().flat_map(|f| f.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|k| {
            let values: Vec<String> = flat
                .iter()
                .map(|f| f.get(k).cloned().unwrap_or_else(|| "—".into()))
                .collect();
            values
                .iter()
                .any(|v| *v != values[0])
                .then(|| (k.clone(), values))
        })
        .collect()
}

/// One axis of a parallel-coordinates view: a parameter or the objective.
#[derive(Debug, Clone, PartialEq)]
pub struct ParallelAxis {
    pub name: String,
    /// What its bottom and top read.
    pub low: String,
    pub high: String,
    /// The values it names, bottom to top, when they are not numbers.
    pub categories: Vec<String>,
}

/// A trial across the axes: its place on each, 0 (bottom) to 1 (top), and its objective's
/// place among the trials, 0 (best) to 1 (worst), for its colour.
#[derive(Debug, Clone, PartialEq)]
pub struct ParallelLine {
    pub trial: u32,
    pub at: Vec<f64>,
    pub rank: f64,
}

/// The parallel-coordinates view of trials: an axis per parameter (numbers on a linear or,
/// spanning two decades or more of positive values, a log scale; anything else as
/// categories) and the objective last, which orders the colours (`lower_better`).
/// Trials without the objective or a parameter are left out.
pub fn parallel(
    params: &[String],
    objective: &str,
    lower_better: bool,
    trials: &[(u32, BTreeMap<String, Value>, Option<f64>)],
) -> (Vec<ParallelAxis>, Vec<ParallelLine>) {
    let kept: Vec<&(u32, BTreeMap<String, Value>, Option<f64>)> = trials
        .iter()
        .filter(|(_, p, o)| {
            o.is_some_and(f64::is_finite) && params.iter().all(|k| p.contains_key(k))
        })
        .collect();
    let mut axes = Vec::new();
    // Per axis, each kept trial's place.
    let mut places: Vec<Vec<f64>> = Vec::new();
    let scale = |vals: &[f64]| -> (Vec<f64>, String, String) {
        let (lo, hi) = vals
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(*v), b.max(*v)));
        let log = lo > 0.0 && hi / lo >= 100.0;
        let f = |v: f64| if log { v.log10() } else { v };
        let (a, b) = (f(lo), f(hi));
        let at = vals
            .iter()
            .map(|v| if b > a { (f(*v) - a) / (b - a) } else { 0.5 })
            .collect();
        let digits = distinct_digits(&[lo, hi]).max(2);
        (at, significant(lo, digits), significant(hi, digits))
    };
    for name in params {
        let raw: Vec<&Value> = kept.iter().map(|(_, p, _)| &p[name]).collect();
        let numbers: Option<Vec<f64>> = raw.iter().map(|v| v.as_f64()).collect();
        match numbers {
            Some(vals) if !vals.is_empty() => {
                let (at, low, high) = scale(&vals);
                axes.push(ParallelAxis {
                    name: name.clone(),
                    low,
                    high,
                    categories: Vec::new(),
                });
                places.push(at);
            }
            _ => {
                let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                let mut cats: Vec<String> = raw.iter().map(|v| text(v)).collect();
                cats.sort();
                cats.dedup();
                let n = cats.len().max(2) - 1;
                places.push(
                    raw.iter()
                        .map(|v| {
                            let i = cats.iter().position(|c| *c == text(v)).unwrap_or(0);
                            if cats.len() == 1 {
                                0.5
                            } else {
                                i as f64 / n as f64
                            }
                        })
                        .collect(),
                );
                axes.push(ParallelAxis {
                    name: name.clone(),
                    low: cats.first().cloned().unwrap_or_default(),
                    high: cats.last().cloned().unwrap_or_default(),
                    categories: cats,
                });
            }
        }
    }
    let objective_values: Vec<f64> = kept.iter().filter_map(|(_, _, o)| *o).collect();
    if !objective_values.is_empty() {
        let (at, low, high) = scale(&objective_values);
        axes.push(ParallelAxis {
            name: objective.to_owned(),
            low,
            high,
            categories: Vec::new(),
        });
        places.push(at);
    }
    let (lo, hi) = objective_values
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(*v), b.max(*v)));
    let lines = kept
        .iter()
        .enumerate()
        .map(|(i, (trial, _, o))| {
            let o = o.unwrap_or(lo);
            let frac = if hi > lo { (o - lo) / (hi - lo) } else { 0.0 };
            ParallelLine {
                trial: *trial,
                at: places.iter().map(|p| p[i]).collect(),
                rank: if lower_better { frac } else { 1.0 - frac },
            }
        })
        .collect();
    (axes, lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trials_cross_their_parameters_to_their_objective() {
        let t = |trial: u32, lr: f64, opt: &str, loss: Option<f64>| {
            let p: BTreeMap<String, Value> = [
                ("lr".to_string(), serde_json::json!(lr)),
                ("opt".to_string(), serde_json::json!(opt)),
            ]
            .into();
            (trial, p, loss)
        };
        let params = vec!["lr".to_string(), "opt".to_string()];
        let trials = vec![
            t(0, 0.1, "sgd", Some(0.9)),
            t(1, 0.001, "adam", Some(0.1)),
            t(2, 0.01, "sgd", Some(0.5)),
            t(3, 0.01, "adam", None),
        ];
        let (axes, lines) = parallel(&params, "loss", true, &trials);
        assert_eq!(
            axes.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
            ["lr", "opt", "loss"]
        );
        assert_eq!(axes[1].categories, ["adam", "sgd"]);
        assert_eq!(lines.len(), 3, "a trial without the objective is left out");
        // lr spans two decades: a log axis, 0.01 half way.
        assert_eq!(lines[2].at[0], 0.5);
        assert_eq!(lines[1].at, vec![0.0, 0.0, 0.0]);
        assert_eq!(lines[1].rank, 0.0, "the lowest loss is the best");
        assert_eq!(lines[0].rank, 1.0);
        assert_eq!(
            (axes[0].low.as_str(), axes[0].high.as_str()),
            ("0.001", "0.1")
        );
    }

    #[test]
    fn ticks_fall_on_round_numbers() {
        assert_eq!(nice_ticks(0.0, 0.15, 4, 0.0), vec![0.0, 0.05, 0.1, 0.15]);
        assert_eq!(
            nice_ticks(0.0, 100.0, 4, 0.0),
            vec![0.0, 25.0, 50.0, 75.0, 100.0]
        );
        // Steps of training: whole numbers only.
        assert_eq!(nice_ticks(0.0, 29.0, 4, 1.0), vec![0.0, 10.0, 20.0]);
        assert_eq!(nice_ticks(0.0, 3.0, 4, 1.0), vec![0.0, 1.0, 2.0, 3.0]);
        for t in nice_ticks(-0.3, 0.3, 4, 0.0) {
            assert_eq!(short_number(t), short_number(t), "{t}");
            assert!(
                ["-0.30", "-0.20", "-0.10", "0", "0.10", "0.20", "0.30"]
                    .contains(&short_number(t).as_str()),
                "{t}"
            );
        }
        assert_eq!(log_range(0.02, 3.0), (-2.0, 1.0));
        let shown = |lo, hi| -> Vec<String> {
            log_ticks(lo, hi)
                .into_iter()
                .map(|(_, v)| short_number(v))
                .collect()
        };
        assert_eq!(
            shown(-1.0, 1.0),
            ["0.10", "0.20", "0.50", "1", "2", "5", "10"]
        );
        assert_eq!(shown(-2.0, 1.0), ["0.010", "0.10", "1", "10"]);
        assert_eq!(log_ticks(-6.0, 0.0).len(), 7);
    }
    use serde_json::json;

    #[test]
    fn axes_have_round_ends_that_hold_the_data() {
        for (lo, hi) in [
            (0.2, 0.93),
            (0.91, 0.95),
            (3.0, 3.0),
            (-2.0, 7.5),
            (0.0, 0.0),
        ] {
            let (a, b) = y_range(lo, hi, None);
            assert!(a <= lo && b >= hi && b > a, "{lo}..{hi} → {a}..{b}");
        }
        // Accuracy between 0.91 and 0.95 is not squashed against zero.
        assert!(y_range(0.91, 0.95, None).0 > 0.5);
        // Loss falling from 2.3 to 0.1 starts at zero.
        assert_eq!(y_range(0.1, 2.3, None).0, 0.0);
        assert_eq!(y_range(10.0, 40.0, Some(100.0)), (0.0, 100.0));
    }

    #[test]
    fn the_pointer_finds_the_nearest_point() {
        let p = [(0.0, 1.0), (10.0, 2.0), (20.0, 3.0)];
        assert_eq!(nearest(&p, -5.0), Some((0.0, 1.0)));
        assert_eq!(nearest(&p, 14.0), Some((10.0, 2.0)));
        assert_eq!(nearest(&p, 16.0), Some((20.0, 3.0)));
        assert_eq!(nearest(&p, 99.0), Some((20.0, 3.0)));
        assert_eq!(nearest(&[], 1.0), None);
    }

    #[test]
    fn smoothing_starts_at_the_data_and_follows_it() {
        let p: Vec<(f64, f64)> = (0..200)
            .map(|i| (f64::from(i), if i % 2 == 0 { 1.0 } else { 3.0 }))
            .collect();
        let s = smooth(&p, 0.9);
        assert_eq!(s.len(), p.len());
        assert!((s[0].1 - 1.0).abs() < 1e-9, "no start-up bias: {}", s[0].1);
        assert!(
            (s[199].1 - 2.0).abs() < 0.15,
            "settles on the mean: {}",
            s[199].1
        );
        assert_eq!(smooth(&p, 0.0), p);
    }

    #[test]
    fn time_becomes_step_between_reports() {
        let steps = [(1000.0, 0.0), (2000.0, 100.0), (4000.0, 200.0)];
        let gpu = [
            (500.0, 0.1),
            (1000.0, 0.2),
            (1500.0, 0.3),
            (3000.0, 0.4),
            (5000.0, 0.5),
        ];
        assert_eq!(
            by_step(&gpu, &steps),
            vec![(0.0, 0.2), (50.0, 0.3), (150.0, 0.4)]
        );
        assert!(by_step(&gpu, &[]).is_empty());
    }

    #[test]
    fn compared_specs_show_only_their_differences() {
        let a = json!({"image": "pt:2.1", "command": ["python", "train.py"], "resources": {"gpu": {"count": 1}}, "batch_size": 64, "env": {}});
        let b = json!({"image": "pt:2.1", "command": ["python", "train.py", "--lr", "0.1"], "resources": {"gpu": {"count": 2}}, "env": {}});
        let d = differences(&[a, b]);
        let keys: Vec<&str> = d.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["batch_size", "command", "resources.gpu.count"]);
        assert_eq!(d[0].1, ["64", "—"]);
        assert_eq!(d[2].1, ["1", "2"]);
    }

    #[test]
    fn values_that_differ_read_differently() {
        assert_eq!(significant(0.012345, 3), "0.0123");
        assert_eq!(significant(123456.0, 3), "123456");
        assert_eq!(significant(2.5, 3), "2.5");
        assert_eq!(significant(1.5e-6, 3), "1.50e-6");
        let losses = [0.01021, 0.01034, 0.01005, 0.0102];
        let d = distinct_digits(&losses);
        assert_eq!(d, 4);
        let shown: std::collections::BTreeSet<String> =
            losses.iter().map(|v| significant(*v, d)).collect();
        assert_eq!(shown.len(), losses.len());
        assert_eq!(distinct_digits(&[0.5, 0.25]), 3);
        assert_eq!(distinct_digits(&[]), 3);
    }

    #[test]
    fn numbers_are_short() {
        assert_eq!(short_number(1234.0), "1234");
        assert_eq!(short_number(12.34), "12.3");
        assert_eq!(short_number(0.5), "0.50");
        assert_eq!(short_number(0.0123), "0.012");
        assert_eq!(short_number(0.00001), "1.00e-5");
    }
}
