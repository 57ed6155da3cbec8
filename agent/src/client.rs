//! The agent's HTTP client for `/api/v1/agent/*`.

use std::sync::RwLock;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::ClientError;
use crate::protocol::{
    ArtifactCommit, ArtifactCreated, ArtifactStart, AttemptRef, DataManifest, FinishedReport,
    LogBatch, MetricBatch, NotKeptReport, PollRequest, PollResponse, RegisterRequest,
    RegisterResponse,
};

/// Time allowed for an ordinary report.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Time a poll may take beyond its wait. The server answers a poll when its wait is over, so
/// a poll still unanswered long after was lost on the way (a dropped handshake, a dead
/// connection): asking again soon keeps the node from being judged lost, which the server
/// does after 30 s of silence by default, less than a poll's wait plus [`REQUEST_TIMEOUT`].
pub const POLL_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct ServerClient {
    http: reqwest::Client,
    base: String,
    credential: RwLock<Option<String>>,
}

impl ServerClient {
    pub fn new(server_url: &str) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!("autodl-agent/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(ServerClient {
            http,
            base: server_url.trim_end_matches('/').to_string(),
            credential: RwLock::new(None),
        })
    }

    pub fn set_credential(&self, credential: Option<String>) {
        *self.credential.write().unwrap_or_else(|e| e.into_inner()) = credential;
    }

    /// The WebSocket request for tunnel `id` on `server` (this client's server when `None`),
    /// with the node's credential.
    pub fn tunnel_request(
        &self,
        id: &str,
        server: Option<&str>,
    ) -> Result<tokio_tungstenite::tungstenite::handshake::client::Request, ClientError> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let server = server.map_or(self.base.as_str(), |s| s.trim_end_matches('/'));
        let base = if let Some(rest) = server.strip_prefix("https://") {
            format!("wss://{rest}")
        } else if let Some(rest) = server.strip_prefix("http://") {
            format!("ws://{rest}")
        } else {
            server.to_owned()
        };
        let url = format!("{base}/api/v1/agent/tunnels/{}", encode_segment(id));
        let mut req = url
            .as_str()
            .into_client_request()
            .map_err(|e| ClientError::Local(format!("tunnel address {url}: {e}")))?;
        if let Some(c) = self
            .credential
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
        {
            if let Ok(v) = format!("Bearer {c}").parse() {
                req.headers_mut().insert("authorization", v);
            }
        }
        Ok(req)
    }

    pub fn has_credential(&self) -> bool {
        self.credential
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    async fn post<B: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<Option<R>, ClientError> {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .timeout(timeout)
            .json(body);
        if let Some(c) = self
            .credential
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
        {
            req = req.bearer_auth(c);
        }
        let resp = req.send().await?;
        let status = resp.status();
        if !status.is_success() {
            let mut body = resp.text().await.unwrap_or_default();
            body.truncate(500);
            return Err(ClientError::Status {
                status: status.as_u16(),
                body,
            });
        }
        let bytes = resp.bytes().await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ClientError::Status {
                status: status.as_u16(),
                body: format!("unexpected answer: {e}"),
            })
    }

    async fn post_unit<B: Serialize + ?Sized>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<(), ClientError> {
        self.post::<B, serde_json::Value>(path, body, REQUEST_TIMEOUT)
            .await
            .map(|_| ())
    }

    /// Sent without a credential: the registration token is the proof.
    pub async fn register(&self, req: &RegisterRequest) -> Result<RegisterResponse, ClientError> {
        self.set_credential(None);
        self.post(REGISTER, req, REQUEST_TIMEOUT)
            .await?
            .ok_or_else(|| ClientError::Status {
                status: 201,
                body: "empty registration answer".into(),
            })
    }

    pub async fn poll(
        &self,
        wait: Duration,
        req: &PollRequest,
    ) -> Result<PollResponse, ClientError> {
        let path = format!("/api/v1/agent/poll?wait={}", wait.as_secs());
        Ok(self
            .post(&path, req, wait + POLL_GRACE)
            .await?
            .unwrap_or_default())
    }

    pub async fn started(&self, task_id: &str, attempt: u32) -> Result<(), ClientError> {
        self.post_unit(&task_path(task_id, "started"), &AttemptRef { attempt })
            .await
    }

    /// A step before the attempt starts, for the task's timeline.
    pub async fn progress(
        &self,
        task_id: &str,
        report: &autodl_common::agent::ProgressReport,
    ) -> Result<(), ClientError> {
        self.post_unit(&task_path(task_id, "progress"), report)
            .await
    }

    pub async fn logs(&self, task_id: &str, batch: &LogBatch) -> Result<(), ClientError> {
        self.post_unit(&task_path(task_id, "logs"), &Stamped::now(batch))
            .await
    }

    pub async fn finished(
        &self,
        task_id: &str,
        report: &FinishedReport,
    ) -> Result<(), ClientError> {
        self.post_unit(&task_path(task_id, "finished"), report)
            .await
    }

    pub async fn not_kept(&self, task_id: &str, report: &NotKeptReport) -> Result<(), ClientError> {
        self.post_unit(&task_path(task_id, "not-kept"), report)
            .await
    }

    pub async fn metrics(&self, batch: &MetricBatch) -> Result<(), ClientError> {
        self.post_unit("/api/v1/agent/metrics", &Stamped::now(batch))
            .await
    }

    fn authorized(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self
            .credential
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
        {
            Some(c) => req.bearer_auth(c),
            None => req,
        }
    }

    async fn check(resp: reqwest::Response) -> Result<reqwest::Response, ClientError> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let mut body = resp.text().await.unwrap_or_default();
        body.truncate(500);
        Err(ClientError::Status {
            status: status.as_u16(),
            body,
        })
    }

    pub async fn start_artifact(
        &self,
        task_id: &str,
        req: &ArtifactStart,
    ) -> Result<ArtifactCreated, ClientError> {
        self.post(&task_path(task_id, "artifacts"), req, REQUEST_TIMEOUT)
            .await?
            .ok_or_else(|| ClientError::Status {
                status: 201,
                body: "empty answer".into(),
            })
    }

    /// Streams one file of an artifact from disk.
    pub async fn put_artifact_file(
        &self,
        artifact_id: &str,
        rel_path: &str,
        file: &std::path::Path,
    ) -> Result<(), ClientError> {
        let f = tokio::fs::File::open(file)
            .await
            .map_err(|e| ClientError::Local(format!("reading {}: {e}", file.display())))?;
        let len = f.metadata().await.map(|m| m.len()).unwrap_or(0);
        let body =
            reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(f, 1 << 20));
        let url = format!(
            "{}/api/v1/agent/artifacts/{}/files/{}",
            self.base,
            encode_segment(artifact_id),
            encode_path(rel_path)
        );
        // Generous: a slow link should still finish a large checkpoint (at least ~1 MB/s).
        let timeout = REQUEST_TIMEOUT + Duration::from_secs(len / 1_000_000);
        let req = self
            .authorized(self.http.put(url))
            .timeout(timeout)
            .header(reqwest::header::CONTENT_LENGTH, len)
            .body(body);
        Self::check(req.send().await?).await.map(|_| ())
    }

    pub async fn commit_artifact(
        &self,
        artifact_id: &str,
        commit: &ArtifactCommit,
    ) -> Result<(), ClientError> {
        let path = format!(
            "/api/v1/agent/artifacts/{}/commit",
            encode_segment(artifact_id)
        );
        self.post_unit(&path, commit).await
    }

    /// Gives up an upload: the server deletes what it received of it.
    pub async fn abandon_artifact(&self, artifact_id: &str) -> Result<(), ClientError> {
        let path = format!(
            "/api/v1/agent/artifacts/{}/abandon",
            encode_segment(artifact_id)
        );
        self.post_unit(&path, &serde_json::json!({})).await
    }

    /// Downloads `path` (below `/api/v1/agent/`) into `dest`, through a temporary file so a
    /// broken transfer never leaves a partial file under the real name.
    pub async fn download(&self, path: &str, dest: &std::path::Path) -> Result<u64, ClientError> {
        use futures_util::StreamExt;
        use tokio::io::AsyncWriteExt;
        let io = |e: std::io::Error| ClientError::Local(format!("writing {}: {e}", dest.display()));
        let resp = self
            .authorized(self.http.get(format!("{}/api/v1/agent/{path}", self.base)))
            .timeout(Duration::from_secs(6 * 3600))
            .send()
            .await?;
        let resp = Self::check(resp).await?;
        let dir = dest
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        tokio::fs::create_dir_all(dir).await.map_err(io)?;
        // A file of its own beside the destination (two downloads to one place never write
        // into each other's, and the last rename wins whole), removed when dropped: a transfer
        // that breaks, fails to write or is abandoned leaves nothing on the node's disk.
        let name = dest.file_name().unwrap_or_default().to_string_lossy();
        // Readable by every task user, as any file the agent writes for tasks (datasets,
        // checkpoints); tempfile's own default is owner-only.
        let part = tempfile::Builder::new()
            .prefix(&format!("{name}."))
            .suffix(".autodl-part")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .tempfile_in(dir)
            .map_err(io)?;
        let mut out = tokio::fs::File::from_std(part.as_file().try_clone().map_err(io)?);
        let mut n = 0u64;
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            n += chunk.len() as u64;
            out.write_all(&chunk).await.map_err(io)?;
        }
        out.flush().await.map_err(io)?;
        drop(out);
        part.persist(dest).map_err(|e| io(e.error))?;
        Ok(n)
    }

    pub async fn data_manifest(&self, task_id: &str) -> Result<DataManifest, ClientError> {
        let resp = self
            .authorized(
                self.http
                    .get(format!("{}{}", self.base, task_path(task_id, "data"))),
            )
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await?;
        let resp = Self::check(resp).await?;
        Ok(resp.json().await?)
    }
}

/// Percent-encodes each segment of a `/`-separated relative path.
pub fn encode_path(p: &str) -> String {
    p.split('/')
        .map(encode_segment)
        .collect::<Vec<_>>()
        .join("/")
}

const REGISTER: &str = "/api/v1/agent/register";

fn task_path(task_id: &str, what: &str) -> String {
    format!("/api/v1/agent/tasks/{}/{what}", encode_segment(task_id))
}

/// Percent-encodes everything but unreserved characters, so any task id is one path segment.
pub use autodl_common::uri::encode_component as encode_segment;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(
            task_path("3f2a-11", "logs"),
            "/api/v1/agent/tasks/3f2a-11/logs"
        );
        assert_eq!(encode_segment("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn error_classes() {
        let s = |status| ClientError::Status {
            status,
            body: String::new(),
        };
        assert!(s(409).is_conflict() && !s(409).is_transient());
        assert!(s(401).is_unauthorized());
        assert!(s(503).is_transient() && s(404).is_transient());
        assert!(!s(400).is_transient());
    }

    #[tokio::test]
    async fn unreachable_server_is_transient() {
        // Port 9 (discard) on loopback is closed on test machines: connection refused.
        let c = ServerClient::new("http://127.0.0.1:9").unwrap();
        let e = c
            .poll(
                Duration::from_secs(1),
                &PollRequest {
                    running: vec![],
                    gpus: Some(vec![]),
                    host: Some(crate::protocol::AgentHost {
                        runtime: "process".into(),
                        isolation: "none".into(),
                        data_roots: vec![],
                        ..Default::default()
                    }),
                },
            )
            .await
            .unwrap_err();
        assert!(e.is_transient(), "{e}");
    }

    /// A server on loopback that answers every request with `answer`, then closes the
    /// connection; its address, and the task to abort.
    async fn answering(answer: Vec<u8>) -> (String, tokio::task::JoinHandle<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let _ = conn.write_all(&answer).await;
            }
        });
        (format!("http://{addr}"), server)
    }

    /// A download whose connection breaks halfway leaves no partial file behind: retries
    /// would otherwise pile one up per try on the node's disk.
    #[tokio::test]
    async fn a_broken_download_leaves_nothing_behind() {
        // 5,000 bytes of the 1,000,000 promised, then closed: the stream ends in an error.
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n";
        let (url, server) = answering([&head[..], &[7u8; 5000]].concat()).await;
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("sub").join("data.bin");
        let c = ServerClient::new(&url).unwrap();
        for _ in 0..3 {
            assert!(c.download("files/x", &dest).await.is_err());
        }
        let left: Vec<_> = std::fs::read_dir(dest.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
        server.abort();
    }

    /// A complete download is in place whole, readable by the tasks' own users.
    #[tokio::test]
    async fn a_download_lands_whole_and_readable_by_tasks() {
        use std::os::unix::fs::PermissionsExt;
        let (url, server) =
            answering(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello".to_vec()).await;
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("labels.txt");
        let c = ServerClient::new(&url).unwrap();
        assert_eq!(c.download("files/x", &dest).await.unwrap(), 5);
        assert_eq!(std::fs::read(&dest).unwrap(), b"hello");
        let mode = std::fs::metadata(&dest).unwrap().permissions().mode();
        assert_eq!(mode & 0o044, 0o044, "mode {mode:o}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        server.abort();
    }

    /// A poll whose answer never comes (the server took the connection and went quiet) is
    /// given up soon after its wait, so the agent asks again well before it would be judged
    /// lost, rather than after a poll's wait plus an ordinary report's timeout.
    #[tokio::test]
    async fn a_poll_lost_on_the_way_is_given_up_after_its_grace() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let c = ServerClient::new(&format!("http://{addr}")).unwrap();
        let wait = Duration::from_secs(1);
        let began = std::time::Instant::now();
        let e = c.poll(wait, &PollRequest::default()).await.unwrap_err();
        let took = began.elapsed();
        assert!(e.is_transient(), "{e}");
        assert!(took >= wait + POLL_GRACE, "gave up after {took:?}");
        assert!(
            took < wait + POLL_GRACE + Duration::from_secs(3),
            "{took:?}"
        );
        silent.abort();
    }
}

/// A batch with the agent's clock at the moment of sending (each retry stamps anew), from
/// which the server corrects the times in it for this node's clock skew.
#[derive(Serialize)]
struct Stamped<'a, T: Serialize> {
    #[serde(flatten)]
    body: &'a T,
    sent_at: String,
}

impl<'a, T: Serialize> Stamped<'a, T> {
    fn now(body: &'a T) -> Self {
        Stamped {
            body,
            sent_at: crate::protocol::now_rfc3339(),
        }
    }
}
