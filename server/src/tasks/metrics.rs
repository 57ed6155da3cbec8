//! A task's stored numbers as the API shows them: samples (the GPUs' and the task's own, by
//! time) and, for charts, named lines thinned to a budget of points.

use std::collections::BTreeMap;

use autodl_common::metrics::{self, MetricLine, MetricLines};
use autodl_common::tasks::MetricSample;

use crate::domain::rfc3339;
use crate::store::{GpuSampleRecord, MetricRecord};

/// The latest value of each number in `reported` (oldest first): what a task's summary
/// shows. Values that are not finite numbers are left out.
pub fn latest<'a>(reported: impl IntoIterator<Item = &'a MetricRecord>) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for r in reported {
        let Ok(values) =
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&r.sample)
        else {
            continue;
        };
        for (k, v) in values {
            if let Some(f) = v.as_f64().filter(|f| f.is_finite()) {
                out.insert(k, f);
            }
        }
    }
    out
}

/// Samples by time: each reported record as it came, and one sample per GPU sampling instant
/// with utilization averaged over the task's GPUs and memory summed (each GPU's own values
/// kept as `gpu<i>_util` / `gpu<i>_mem`). `gpu` is ordered by time.
pub fn samples(reported: Vec<MetricRecord>, gpu: &[GpuSampleRecord]) -> Vec<(i64, MetricSample)> {
    let mut out: Vec<(i64, MetricSample)> = reported
        .into_iter()
        .map(|r| {
            let mut values: BTreeMap<String, f64> =
                serde_json::from_str(&r.sample).unwrap_or_default();
            let sample = MetricSample {
                at: rfc3339(r.at),
                gpu_util: None,
                mem_used: None,
                mem_total: None,
                epoch: values.remove("epoch"),
                loss: values.remove("loss"),
                values,
            };
            (r.at, sample)
        })
        .collect();
    for group in gpu.chunk_by(|a, b| a.at == b.at) {
        let n = group.len() as f64;
        let mut values = BTreeMap::new();
        let (mut util, mut used, mut total) = (0.0, 0u64, 0u64);
        for g in group {
            util += g.util;
            used += g.mem_used.max(0) as u64;
            total += g.mem_total.max(0) as u64;
            values.insert(format!("gpu{}_util", g.gpu_index), g.util);
            values.insert(format!("gpu{}_mem", g.gpu_index), g.mem_used as f64);
        }
        out.push((
            group[0].at,
            MetricSample {
                at: rfc3339(group[0].at),
                gpu_util: Some(util / n),
                mem_used: Some(used),
                mem_total: Some(total),
                epoch: None,
                loss: None,
                values,
            },
        ));
    }
    out.sort_by_key(|(at, _)| *at);
    out
}

/// Samples as named lines, each thinned to at most `budget` points.
pub fn lines(samples: &[(i64, MetricSample)], budget: usize) -> Vec<MetricLine> {
    let mut lines = Vec::new();
    for (at, s) in samples {
        metrics::append_sample(&mut lines, *at as f64, s);
    }
    for line in &mut lines {
        line.points = metrics::thin(&line.points, budget);
    }
    metrics::sort_lines(&mut lines);
    lines
}

/// Reads a window's samples as lines: everything stored in `[from, to]`, up to `max_rows` rows
/// of each kind (`truncated` says when more were there).
pub async fn window(
    store: &dyn crate::store::Store,
    task_id: &str,
    from: i64,
    to: i64,
    budget: usize,
    max_rows: i64,
) -> Result<MetricLines, crate::store::StoreError> {
    let reported = store
        .task_metrics_window(task_id, from, to, max_rows)
        .await?;
    let mut gpu = store
        .task_gpu_samples_window(task_id, from, to, max_rows)
        .await?;
    let mut truncated = reported.len() as i64 >= max_rows;
    if gpu.len() as i64 >= max_rows {
        truncated = true;
        // The last instant may be cut between GPUs: leave it out rather than show a false sum.
        if let Some(last) = gpu.last().map(|g| g.at) {
            gpu.retain(|g| g.at != last);
        }
    }
    let samples = samples(reported, &gpu);
    Ok(MetricLines {
        raw_points: samples.len() as u64,
        lines: lines(&samples, budget),
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_holds_each_number_s_latest_value() {
        let rec = |at, sample: &str| MetricRecord {
            at,
            sample: sample.into(),
        };
        let reported = [
            rec(1, r#"{"loss": 2.0, "step": 1, "lr": 0.1}"#),
            rec(2, r#"{"val_loss": 1.5, "note": "x"}"#),
            rec(3, r#"{"loss": 1.25, "step": 2}"#),
            rec(4, "not json"),
        ];
        assert_eq!(
            latest(&reported).into_iter().collect::<Vec<_>>(),
            [
                ("loss".to_owned(), 1.25),
                ("lr".to_owned(), 0.1),
                ("step".to_owned(), 2.0),
                ("val_loss".to_owned(), 1.5)
            ]
        );
    }
}
