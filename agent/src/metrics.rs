//! Prometheus metrics of one agent. Each agent has its own registry (not the global default)
//! so several agents embedded in one server process do not collide.

use std::collections::HashMap;

use prometheus::{
    Encoder, GaugeVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::gpu::{AgentGpu, GpuSample};

#[derive(Clone)]
pub struct AgentMetrics {
    registry: Registry,
    pub gpu_util: GaugeVec,
    pub gpu_mem_used: GaugeVec,
    pub gpu_mem_total: GaugeVec,
    pub gpu_temperature: GaugeVec,
    pub gpu_power: GaugeVec,
    pub tasks_running: IntGauge,
    pub tasks_finished: IntCounterVec,
    pub samples_sent: IntCounter,
    pub samples_dropped: IntCounter,
    pub log_lines_sent: IntCounter,
    pub server_reachable: IntGauge,
}

impl std::fmt::Debug for AgentMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentMetrics").finish_non_exhaustive()
    }
}

fn gauge_vec(r: &Registry, name: &str, help: &str) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), &["gpu", "type"]).expect("valid metric");
    r.register(Box::new(g.clone())).expect("unique metric");
    g
}

fn int_counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric");
    r.register(Box::new(c.clone())).expect("unique metric");
    c
}

impl AgentMetrics {
    pub fn new(node_id: &str) -> Self {
        let labels = HashMap::from([("node".to_string(), node_id.to_string())]);
        let r = Registry::new_custom(Some("autodl_agent".into()), Some(labels))
            .expect("valid registry");
        let tasks_running = IntGauge::new("tasks_running", "Task attempts running on this node.")
            .expect("valid metric");
        r.register(Box::new(tasks_running.clone()))
            .expect("unique metric");
        let tasks_finished = IntCounterVec::new(
            Opts::new("tasks_finished_total", "Task attempts ended, by reason."),
            &["reason"],
        )
        .expect("valid metric");
        r.register(Box::new(tasks_finished.clone()))
            .expect("unique metric");
        let server_reachable = IntGauge::new(
            "server_reachable",
            "1 when the last call to the server got an answer.",
        )
        .expect("valid metric");
        r.register(Box::new(server_reachable.clone()))
            .expect("unique metric");
        AgentMetrics {
            gpu_util: gauge_vec(&r, "gpu_utilization", "GPU utilisation, 0 to 1."),
            gpu_mem_used: gauge_vec(&r, "gpu_memory_used_bytes", "GPU memory in use."),
            gpu_mem_total: gauge_vec(&r, "gpu_memory_total_bytes", "GPU memory installed."),
            gpu_temperature: gauge_vec(&r, "gpu_temperature_celsius", "GPU temperature."),
            gpu_power: gauge_vec(&r, "gpu_power_watts", "GPU power draw."),
            tasks_running,
            tasks_finished,
            samples_sent: int_counter(
                &r,
                "samples_sent_total",
                "GPU samples accepted by the server.",
            ),
            samples_dropped: int_counter(
                &r,
                "samples_dropped_total",
                "GPU samples dropped because the buffer was full or the server rejected them.",
            ),
            log_lines_sent: int_counter(
                &r,
                "log_lines_sent_total",
                "Task log lines accepted by the server.",
            ),
            server_reachable,
            registry: r,
        }
    }

    pub fn observe(&self, inventory: &[AgentGpu], samples: &[GpuSample]) {
        for s in samples {
            let gpu = s.gpu_index.to_string();
            let ty = inventory
                .iter()
                .find(|g| g.index == s.gpu_index)
                .map_or("", |g| g.gpu_type.as_str());
            let l = [gpu.as_str(), ty];
            self.gpu_util.with_label_values(&l).set(s.util);
            self.gpu_mem_used
                .with_label_values(&l)
                .set(s.mem_used as f64);
            self.gpu_mem_total
                .with_label_values(&l)
                .set(s.mem_total as f64);
            if let Some(t) = s.temperature {
                self.gpu_temperature.with_label_values(&l).set(f64::from(t));
            }
            if let Some(p) = s.power_w {
                self.gpu_power.with_label_values(&l).set(p);
            }
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "could not encode metrics");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// A deliberately minimal HTTP/1.0-style server: one request per connection, `GET /metrics`
/// only. Prometheus needs nothing more, and it avoids a web framework in the agent.
pub async fn serve(listener: TcpListener, metrics: AgentMetrics, shutdown: CancellationToken) {
    loop {
        let (mut conn, _) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut head = Vec::with_capacity(1024);
            let mut buf = [0u8; 1024];
            let read = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
            })
            .await;
            if read.is_err() {
                return;
            }
            let first = String::from_utf8_lossy(&head);
            let mut parts = first.split_whitespace();
            let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let path = path.split('?').next().unwrap_or("");
            let (status, ctype, body) = if method == "GET" && path == "/metrics" {
                (
                    "200 OK",
                    "text/plain; version=0.0.4; charset=utf-8",
                    metrics.render(),
                )
            } else {
                ("404 Not Found", "text/plain", "not found\n".to_string())
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(resp.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn exposes_metrics_over_http() {
        let m = AgentMetrics::new("n1");
        let inv = vec![AgentGpu {
            index: 0,
            gpu_type: "A40".into(),
            uuid: Some("GPU-x".into()),
            memory: 100,
        }];
        m.observe(
            &inv,
            &[GpuSample {
                gpu_index: 0,
                util: 0.5,
                mem_used: 40,
                mem_total: 100,
                temperature: Some(50),
                power_w: Some(120.0),
                processes: vec![],
            }],
        );
        m.tasks_running.set(2);
        m.server_reachable.set(1);
        m.samples_sent.inc_by(3);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(listener, m, stop.clone()));

        let get = |path: &'static str| async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).await.unwrap();
            out
        };
        let body = get("/metrics").await;
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        for want in [
            r#"autodl_agent_gpu_utilization{gpu="0",type="A40",node="n1"} 0.5"#,
            r#"autodl_agent_gpu_memory_used_bytes{gpu="0",type="A40",node="n1"} 40"#,
            r#"autodl_agent_tasks_running{node="n1"} 2"#,
            r#"autodl_agent_samples_sent_total{node="n1"} 3"#,
            r#"autodl_agent_server_reachable{node="n1"} 1"#,
        ] {
            assert!(body.contains(want), "{want} missing in\n{body}");
        }
        assert!(get("/other").await.starts_with("HTTP/1.1 404"));
        stop.cancel();
        server.await.unwrap();
    }
}
