//! A task's numbers as named lines for charts: one rule for naming them, shared by the server
//! (which reads stored samples into lines and thins them) and the web app (which appends live
//! samples to the same lines), so a line never changes its name between a reload and a stream.

use serde::{Deserialize, Serialize};
#[cfg(feature = "openapi")]
use utoipa::ToSchema;

use crate::tasks::MetricSample;

/// A reported number as JSON writes it: a whole number as an integer. JSON has one kind of
/// number, and a task that reports `epoch=3` must read back `3`, not `3.0`.
pub fn json_number(x: f64) -> serde_json::Value {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53: every integer below is an exact f64
    if x.fract() == 0.0 && x.abs() < EXACT {
        serde_json::Value::from(x as i64)
    } else {
        serde_json::Number::from_f64(x).map_or(serde_json::Value::Null, serde_json::Value::Number)
    }
}

/// Serializers writing reported numbers by [`json_number`].
pub mod whole {
    use std::collections::BTreeMap;

    use serde::ser::{SerializeMap, Serializer};

    pub fn option<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(x) => serde::Serialize::serialize(&super::json_number(*x), s),
            None => s.serialize_none(),
        }
    }

    pub fn map<S: Serializer>(v: &BTreeMap<String, f64>, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(v.len()))?;
        for (k, x) in v {
            m.serialize_entry(k, &super::json_number(*x))?;
        }
        m.end()
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn whole_numbers_are_integers_and_others_are_not() {
            assert_eq!(super::super::json_number(3.0).to_string(), "3");
            assert_eq!(super::super::json_number(-0.0).to_string(), "0");
            assert_eq!(super::super::json_number(0.25).to_string(), "0.25");
            assert_eq!(super::super::json_number(1e300).to_string(), "1e+300");
        }
    }
}

/// Mean GPU utilization over the task's GPUs, 0..1.
pub const GPU_UTIL: &str = "gpu_util";
/// GPU memory in use, summed over the task's GPUs, bytes.
pub const GPU_MEM_USED: &str = "gpu_mem_used";
/// GPU memory installed, summed over the task's GPUs, bytes.
pub const GPU_MEM_TOTAL: &str = "gpu_mem_total";

/// A task's lines over a window of its run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct MetricLines {
    pub lines: Vec<MetricLine>,
    /// Samples read before thinning (what the window holds).
    pub raw_points: u64,
    /// The window held more samples than the server reads at once; its newest ones are missing.
    pub truncated: bool,
}

/// One named line: `[milliseconds since the epoch, value]` points, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct MetricLine {
    pub name: String,
    pub points: Vec<[f64; 2]>,
}

/// What a line's values measure, which decides the axis it is drawn on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricUnit {
    /// A 0..1 fraction, shown as percent.
    Fraction,
    Bytes,
    /// A number the task reported, in its own unit.
    Reported,
}

/// The unit of a line, from its name.
pub fn unit_of(name: &str) -> MetricUnit {
    if name == GPU_UTIL || per_gpu(name).is_some_and(|(_, kind)| kind == PerGpu::Util) {
        MetricUnit::Fraction
    } else if name == GPU_MEM_USED
        || name == GPU_MEM_TOTAL
        || per_gpu(name).is_some_and(|(_, kind)| kind == PerGpu::Mem)
    {
        MetricUnit::Bytes
    } else {
        MetricUnit::Reported
    }
}

/// What a per-GPU line holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerGpu {
    Util,
    Mem,
}

/// `gpu3_util` → `(3, Util)`; `None` for any other name.
pub fn per_gpu(name: &str) -> Option<(u32, PerGpu)> {
    let rest = name.strip_prefix("gpu")?;
    let (index, kind) = rest.split_once('_')?;
    let kind = match kind {
        "util" => PerGpu::Util,
        "mem" => PerGpu::Mem,
        _ => return None,
    };
    Some((index.parse().ok()?, kind))
}

/// Whether a line comes from the GPUs (the agent) rather than from the task's own reports.
pub fn is_gpu_line(name: &str) -> bool {
    unit_of(name) != MetricUnit::Reported
}

/// Every `(line name, value)` of one sample.
pub fn sample_values(s: &MetricSample) -> Vec<(String, f64)> {
    let mut out = Vec::with_capacity(5 + s.values.len());
    let fixed = [
        (GPU_UTIL, s.gpu_util),
        (GPU_MEM_USED, s.mem_used.map(|b| b as f64)),
        (GPU_MEM_TOTAL, s.mem_total.map(|b| b as f64)),
        ("epoch", s.epoch),
        ("loss", s.loss),
    ];
    for (name, v) in fixed {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            out.push((name.to_owned(), v));
        }
    }
    out.extend(
        s.values
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(k, v)| (k.clone(), *v)),
    );
    out
}

/// Adds a sample at `at_ms` to `lines`, keeping each line in time order: a point not newer than
/// a line's last is dropped (it is already there).
pub fn append_sample(lines: &mut Vec<MetricLine>, at_ms: f64, sample: &MetricSample) {
    for (name, v) in sample_values(sample) {
        match lines.iter_mut().find(|l| l.name == name) {
            Some(line) => {
                if line.points.last().is_none_or(|p| p[0] < at_ms) {
                    line.points.push([at_ms, v]);
                }
            }
            None => lines.push(MetricLine {
                name,
                points: vec![[at_ms, v]],
            }),
        }
    }
}

/// Thins a line to at most `budget` points with Largest-Triangle-Three-Buckets, which keeps
/// the peaks and the shape of a curve (a loss spike survives; an average would hide it).
pub fn thin(points: &[[f64; 2]], budget: usize) -> Vec<[f64; 2]> {
    if points.len() <= budget || budget < 3 {
        return points.to_vec();
    }
    let raw: Vec<lttb::DataPoint> = points
        .iter()
        .map(|p| lttb::DataPoint::new(p[0], p[1]))
        .collect();
    lttb::lttb(raw, budget)
        .into_iter()
        .map(|p| [p.x, p.y])
        .collect()
}

/// Orders lines as a reader expects them: GPU lines first, then the task's own, by name.
pub fn sort_lines(lines: &mut [MetricLine]) {
    lines.sort_by(|a, b| (!is_gpu_line(&a.name), &a.name).cmp(&(!is_gpu_line(&b.name), &b.name)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wave(n: usize) -> Vec<[f64; 2]> {
        (0..n)
            .map(|i| [i as f64 * 1000.0, (i as f64 / 10.0).sin()])
            .collect()
    }

    #[test]
    fn thinning_keeps_the_ends_the_order_and_the_budget() {
        for n in [0, 1, 2, 5, 100, 1000, 12_345] {
            for budget in [3, 10, 500] {
                let p = wave(n);
                let t = thin(&p, budget);
                assert!(
                    t.len() <= budget.max(n.min(budget)),
                    "n={n} budget={budget}"
                );
                if n > budget {
                    assert_eq!(t.len(), budget);
                } else {
                    assert_eq!(t, p);
                }
                if n > 0 {
                    assert_eq!(t.first(), p.first());
                    assert_eq!(t.last(), p.last());
                }
                assert!(t.windows(2).all(|w| w[0][0] < w[1][0]), "time order kept");
                // Every point kept is a real sample, never an average.
                assert!(t.iter().all(|q| p.contains(q)));
            }
        }
    }

    #[test]
    fn a_spike_survives_thinning() {
        let mut p: Vec<[f64; 2]> = (0..10_000).map(|i| [i as f64, 1.0]).collect();
        p[7_777][1] = 50.0;
        let t = thin(&p, 200);
        assert!(t.iter().any(|q| q[1] == 50.0), "the loss spike is kept");
    }

    #[test]
    fn lines_are_named_by_one_rule() {
        let mut s = MetricSample {
            at: "2026-01-01T00:00:00Z".into(),
            gpu_util: Some(0.5),
            mem_used: Some(1 << 30),
            mem_total: None,
            epoch: Some(2.0),
            loss: Some(f64::NAN),
            values: Default::default(),
        };
        s.values.insert("gpu1_util".into(), 0.25);
        s.values.insert("accuracy".into(), 0.9);
        let names: Vec<String> = sample_values(&s).into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            ["gpu_util", "gpu_mem_used", "epoch", "accuracy", "gpu1_util"]
        );
        assert_eq!(unit_of("gpu1_util"), MetricUnit::Fraction);
        assert_eq!(unit_of("gpu12_mem"), MetricUnit::Bytes);
        assert_eq!(unit_of("gpu_mem_total"), MetricUnit::Bytes);
        assert_eq!(unit_of("gpux_util"), MetricUnit::Reported);
        assert_eq!(unit_of("accuracy"), MetricUnit::Reported);

        let mut lines = Vec::new();
        append_sample(&mut lines, 2000.0, &s);
        append_sample(&mut lines, 1000.0, &s);
        append_sample(&mut lines, 3000.0, &s);
        let acc = lines.iter().find(|l| l.name == "accuracy").unwrap();
        assert_eq!(acc.points, vec![[2000.0, 0.9], [3000.0, 0.9]]);
        sort_lines(&mut lines);
        assert_eq!(lines[0].name, "gpu1_util");
        assert_eq!(lines.last().unwrap().name, "epoch");
    }
}
