//! The agent's own loops beside the control loop: the fence that stops tasks when the server
//! has been silent too long, and the GPU sampler.

use super::*;

/// Stops every task once the server has not answered for the fence time ([`fence`]): past
/// its node timeout the server runs them elsewhere, and two runs of a task must never overlap.
pub(super) async fn fence_loop(inner: Arc<Inner>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut fenced = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (after, grace) = fence(inner.node_lost());
        let silent = lock(&inner.last_heard).elapsed();
        if silent < after {
            if fenced {
                tracing::info!("the server answers again: new tasks may start");
            }
            fenced = false;
            continue;
        }
        let running = lock(&inner.tasks).values().any(|e| !e.finished);
        if fenced || !running {
            continue;
        }
        fenced = true;
        tracing::warn!(
            silent_s = silent.as_secs(),
            grace_s = grace.as_secs(),
            "the server has not answered for half its node timeout: stopping every task (they checkpoint within the grace period), so that none runs here while the server starts it elsewhere"
        );
        inner.stop_all(grace);
    }
}

pub(super) async fn sample_loop(inner: Arc<Inner>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(inner.config.sample_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let backend = inner.backend.clone();
        let samples = match tokio::task::spawn_blocking(move || backend.sample()).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "GPU sampling failed");
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "GPU sampling task failed");
                continue;
            }
        };
        inner.metrics.observe(&lock(&inner.inventory), &samples);
        let at = now_rfc3339();
        if inner.backend.is_simulated() {
            inner.publish_simulated_gpus(&at, &samples);
        }
        let holders = inner.gpu_holders();
        {
            let mut q = lock(&inner.samples);
            for s in samples {
                q.push_back(GpuSample {
                    at: at.clone(),
                    gpu_index: s.gpu_index,
                    util: s.util,
                    mem_used: s.mem_used,
                    mem_total: s.mem_total,
                    temperature: s.temperature.map(f64::from),
                    power_w: s.power_w,
                    processes: s.processes,
                    task_id: holders.get(&s.gpu_index).cloned(),
                });
            }
            inner.trim_samples(&mut q);
        }
        if inner.client.has_credential() {
            tokio::select! {
                _ = stop.cancelled() => return,
                () = inner.flush_samples() => {}
            }
        }
    }
}
