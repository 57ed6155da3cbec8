//! Prometheus metrics of one agent. Each agent has its own registry (not the global default)
//! so several agents embedded in one server process do not collide.

use std::collections::HashMap;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use prometheus::{
    Encoder, GaugeVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};
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

/// Serves `GET /metrics` (and `HEAD`) over HTTP/1.1 with hyper's server: keep-alive, pipelining
/// and the protocol's corners come from a maintained implementation, and a client that sends
/// nothing is dropped after a few seconds. Anything else is a 404 (405 for another method on
/// `/metrics`).
pub async fn serve(listener: TcpListener, metrics: AgentMetrics, shutdown: CancellationToken) {
    loop {
        let (conn, _) = tokio::select! {
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
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let answer = respond(&req, &metrics);
                async move { Ok::<_, std::convert::Infallible>(answer) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(5))
                .serve_connection(hyper_util::rt::TokioIo::new(conn), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
}

fn respond<B>(req: &Request<B>, metrics: &AgentMetrics) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r
    };
    if req.uri().path() != "/metrics" {
        return text(StatusCode::NOT_FOUND, "not found\n".into());
    }
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD\n".into());
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    // hyper leaves out the body of an answer to HEAD and keeps its length.
    let mut r = text(StatusCode::OK, metrics.render());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Sends one request on `c` and reads its answer whole (by its Content-Length; none for
    /// HEAD): status, head and body.
    async fn exchange(
        c: &mut tokio::net::TcpStream,
        method: &str,
        path: &str,
        extra: &str,
    ) -> (u16, String, String) {
        let request = format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
        c.write_all(request.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = c.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed before an answer");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let status = head[9..12].parse().unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        let length = if method == "HEAD" { 0 } else { length };
        while buf.len() < end + length {
            let n = c.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed mid-body");
            buf.extend_from_slice(&chunk[..n]);
        }
        let body = String::from_utf8_lossy(&buf[end..end + length]).into_owned();
        (status, head, body)
    }

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

        // One connection, four requests: keep-alive, HEAD, another method, and a 404 that
        // closes it.
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (status, head, body) = exchange(&mut c, "GET", "/metrics", "").await;
        assert_eq!(status, 200, "{head}");
        assert!(head.contains("text/plain; version=0.0.4"), "{head}");
        for want in [
            r#"autodl_agent_gpu_utilization{gpu="0",type="A40",node="n1"} 0.5"#,
            r#"autodl_agent_gpu_memory_used_bytes{gpu="0",type="A40",node="n1"} 40"#,
            r#"autodl_agent_tasks_running{node="n1"} 2"#,
            r#"autodl_agent_samples_sent_total{node="n1"} 3"#,
            r#"autodl_agent_server_reachable{node="n1"} 1"#,
        ] {
            assert!(body.contains(want), "{want} missing in\n{body}");
        }
        let (status, head, body) = exchange(&mut c, "HEAD", "/metrics?x=1", "").await;
        assert_eq!(status, 200, "{head}");
        assert!(body.is_empty(), "{body}");
        assert!(
            head.to_ascii_lowercase().contains("content-length: "),
            "{head}"
        );
        let (status, head, _) = exchange(&mut c, "POST", "/metrics", "").await;
        assert_eq!(status, 405, "{head}");
        let (status, _, _) = exchange(&mut c, "GET", "/other", "Connection: close\r\n").await;
        assert_eq!(status, 404);
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "the connection was closed as asked");
        stop.cancel();
        server.await.unwrap();
    }
}
