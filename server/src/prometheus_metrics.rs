//! Prometheus metrics of the server, served at `/metrics` so an operator's Prometheus and
//! Grafana can watch the platform.

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub tasks: IntGaugeVec,
    pub cycle_seconds: Histogram,
    pub dispatch_latency: Histogram,
    pub gpu_util: GaugeVec,
    pub gpu_mem: GaugeVec,
    pub samples_ingested: IntCounter,
    /// Tasks the scheduler's kept state had wrong when checked against a full read.
    pub state_drift: IntCounter,
    /// Since the leader's last cycle and its last lease renewal, as the database records
    /// them (set when scraped, so any server tells of a stalled or frozen leader).
    pub last_cycle_age: Gauge,
    pub lease_age: Gauge,
}

impl Metrics {
    pub fn new() -> anyhow::Result<Metrics> {
        let registry = Registry::new_custom(Some("autodl".into()), None)?;
        let tasks = IntGaugeVec::new(
            Opts::new("tasks", "Tasks by state (pending, scheduled, running)"),
            &["state"],
        )?;
        let cycle_seconds = Histogram::with_opts(
            HistogramOpts::new("scheduling_cycle_seconds", "Time of one scheduling cycle").buckets(
                vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
                    1.0, 1.5, 2.5, 5.0, 10.0,
                ],
            ),
        )?;
        let dispatch_latency = Histogram::with_opts(
            HistogramOpts::new(
                "dispatch_latency_seconds",
                "From placement to the agent starting the task",
            )
            .buckets(vec![
                0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
            ]),
        )?;
        let gpu_util = GaugeVec::new(
            Opts::new(
                "gpu_utilization_ratio",
                "Last reported GPU utilisation (0..1)",
            ),
            &["node", "gpu"],
        )?;
        let gpu_mem = GaugeVec::new(
            Opts::new("gpu_memory_used_bytes", "Last reported GPU memory in use"),
            &["node", "gpu"],
        )?;
        let samples_ingested =
            IntCounter::new("gpu_samples_ingested_total", "GPU metric samples stored")?;
        registry.register(Box::new(tasks.clone()))?;
        registry.register(Box::new(cycle_seconds.clone()))?;
        registry.register(Box::new(dispatch_latency.clone()))?;
        registry.register(Box::new(gpu_util.clone()))?;
        registry.register(Box::new(gpu_mem.clone()))?;
        let state_drift = IntCounter::new(
            "scheduler_state_drift_total",
            "Tasks the leader's kept state had wrong when compared with a full read",
        )?;
        registry.register(Box::new(samples_ingested.clone()))?;
        registry.register(Box::new(state_drift.clone()))?;
        let last_cycle_age = Gauge::new(
            "scheduler_last_cycle_age_seconds",
            "Since the scheduler's last cycle ended, on whichever server leads (-1: none yet)",
        )?;
        let lease_age = Gauge::new(
            "scheduler_leader_lease_age_seconds",
            "Since the leader last renewed its lease (PostgreSQL; -1: no lease)",
        )?;
        registry.register(Box::new(last_cycle_age.clone()))?;
        registry.register(Box::new(lease_age.clone()))?;
        Ok(Metrics {
            registry,
            tasks,
            cycle_seconds,
            dispatch_latency,
            gpu_util,
            gpu_mem,
            samples_ingested,
            state_drift,
            last_cycle_age,
            lease_age,
        })
    }

    pub fn render(&self) -> anyhow::Result<String> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        Ok(String::from_utf8(buf)?)
    }
}
