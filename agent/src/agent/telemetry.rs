//! The task output and GPU samples this node sends: buffered while the server is away,
//! shipped in bounded batches, the oldest dropped first when a buffer is full.

use super::*;

impl Inner {
    /// Sends one batch; returns false when the attempt turned out stale.
    pub(super) async fn ship_logs(
        &self,
        task_id: &str,
        attempt: u32,
        log: &LogBuffer,
        shutdown: &CancellationToken,
    ) -> bool {
        use std::sync::atomic::Ordering;
        let budget = self.log_batch_bytes.load(Ordering::Relaxed);
        let lines = log.take_within(MAX_LOG_LINES_PER_CALL, budget);
        if lines.is_empty() {
            return true;
        }
        let n = lines.len() as u64;
        let batch = LogBatch {
            attempt,
            lines,
            sent_at: None,
        };
        match self
            .deliver("logs", shutdown, || self.client.logs(task_id, &batch))
            .await
        {
            Delivery::Delivered => {
                self.metrics.log_lines_sent.inc_by(n);
                true
            }
            Delivery::TooLarge => {
                // Never lose output to a body limit: put the lines back and send less at a time.
                let mut lines = batch.lines;
                if lines.len() > 1 || budget > MIN_LOG_BATCH_BYTES {
                    self.log_batch_bytes
                        .store((budget / 2).max(MIN_LOG_BATCH_BYTES), Ordering::Relaxed);
                } else if let Some(only) = lines.first_mut() {
                    let mut cut = only.line.len() / 2;
                    while !only.line.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    only.line.truncate(cut);
                }
                log.requeue_front(lines);
                true
            }
            Delivery::Rejected { stale } => !stale,
            Delivery::Abandoned => true,
        }
    }

    /// On a simulated node, each running attempt's GPUs as its `nvidia-smi` shows them
    /// (numbered from 0 as the task sees them), from the sample just read.
    pub(super) fn publish_simulated_gpus(&self, at: &str, samples: &[crate::gpu::GpuSample]) {
        let running: Vec<(std::path::PathBuf, Vec<u32>)> = lock(&self.tasks)
            .values()
            .filter(|e| !e.finished)
            .filter_map(|e| {
                Some((
                    e.launch.as_ref()?.simulated_gpus_dir(),
                    e.allocation.gpu_indices.clone(),
                ))
            })
            .collect();
        for (dir, indices) in running {
            // Made at the attempt's start and removed at its end: never made again after.
            if dir.is_dir() {
                self.write_simulated_gpus(&dir, &indices, at, samples);
            }
        }
    }

    /// Writes one attempt's simulated GPUs (whole, by a rename) into `dir`.
    pub(super) fn write_simulated_gpus(
        &self,
        dir: &std::path::Path,
        indices: &[u32],
        at: &str,
        samples: &[crate::gpu::GpuSample],
    ) {
        use crate::gpu::smi::{SmiGpu, SmiState, STATE_FILE};
        let inventory = lock(&self.inventory).clone();
        let gpus = indices
            .iter()
            .enumerate()
            .filter_map(|(n, i)| {
                let g = inventory.iter().find(|g| g.index == *i)?;
                let s = samples.iter().find(|s| s.gpu_index == *i);
                Some(SmiGpu {
                    index: n as u32,
                    name: format!("NVIDIA {}", g.gpu_type),
                    uuid: g
                        .uuid
                        .clone()
                        .unwrap_or_else(|| format!("GPU-simulated-{}-{i}", self.config.node_id)),
                    memory_total: g.memory,
                    memory_used: s.map_or(0, |s| s.mem_used),
                    util: s.map_or(0.0, |s| s.util),
                    temperature: s.and_then(|s| s.temperature),
                    power_w: s.and_then(|s| s.power_w),
                })
            })
            .collect();
        let state = SmiState {
            at: at.to_owned(),
            gpus,
        };
        let write = || -> std::io::Result<()> {
            let tmp = dir.join(format!(".{STATE_FILE}.tmp"));
            std::fs::write(
                &tmp,
                serde_json::to_vec(&state).map_err(std::io::Error::other)?,
            )?;
            std::fs::rename(&tmp, dir.join(STATE_FILE))
        };
        if let Err(e) = write() {
            tracing::debug!(dir = %dir.display(), error = %e, "could not write the simulated GPUs");
        }
    }

    pub(super) fn gpu_holders(&self) -> HashMap<u32, String> {
        let mut m = HashMap::new();
        for e in lock(&self.tasks).values().filter(|e| !e.finished) {
            for g in &e.allocation.gpu_indices {
                m.entry(*g).or_insert_with(|| e.allocation.task_id.clone());
            }
        }
        m
    }

    pub(super) async fn flush_samples(&self) {
        loop {
            let batch: Vec<GpuSample> = {
                let mut q = lock(&self.samples);
                let per_call = self
                    .samples_per_call
                    .load(std::sync::atomic::Ordering::Relaxed);
                let n = q.len().min(per_call);
                q.drain(..n).collect()
            };
            if batch.is_empty() {
                return;
            }
            let body = MetricBatch {
                samples: batch,
                sent_at: None,
            };
            match self.client.metrics(&body).await {
                Ok(()) => {
                    self.set_reachable(true);
                    self.metrics.samples_sent.inc_by(body.samples.len() as u64);
                }
                Err(e) if e.is_too_large() && body.samples.len() > 1 => {
                    // Send fewer at a time; the samples go back where they were.
                    self.samples_per_call.store(
                        (body.samples.len() / 2).max(1),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    let mut q = lock(&self.samples);
                    for s in body.samples.into_iter().rev() {
                        q.push_front(s);
                    }
                }
                Err(e) if e.is_transient() || e.is_unauthorized() => {
                    if matches!(e, ClientError::Transport(_)) {
                        self.set_reachable(false);
                    }
                    tracing::debug!(error = %e, "metrics not delivered; keeping them");
                    let mut q = lock(&self.samples);
                    for s in body.samples.into_iter().rev() {
                        q.push_front(s);
                    }
                    self.trim_samples(&mut q);
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, samples = body.samples.len(), "server rejected GPU samples; dropping them");
                    self.metrics
                        .samples_dropped
                        .inc_by(body.samples.len() as u64);
                }
            }
        }
    }

    pub(super) fn trim_samples(&self, q: &mut VecDeque<GpuSample>) {
        let cap = self.config.metrics_buffer_samples.max(1);
        let excess = q.len().saturating_sub(cap);
        if excess > 0 {
            q.drain(..excess);
            self.metrics.samples_dropped.inc_by(excess as u64);
        }
    }
}
