//! `spawn_app()`: a real server on a random port with a fresh database per test, on SQLite or
//! on PostgreSQL (a new database in the cluster named by `AUTODL_TEST_PG_URL`).

use std::sync::Arc;

use autodl_server::clock::{Clock, ManualClock, SystemClock};
use autodl_server::config::Settings;
use autodl_server::scheduling::Runner;
use autodl_server::startup::Application;
use autodl_server::state::AppState;
use autodl_server::store;
use reqwest::{Client, Method, RequestBuilder, Response, StatusCode};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub struct TestApp {
    pub address: String,
    pub state: actix_web::web::Data<AppState>,
    /// Stops the server and its scheduler.
    pub server: actix_web::dev::ServerHandle,
    pub dir: std::sync::Arc<tempfile::TempDir>,
}

pub const PASSWORD: &str = "Tr41n-all-the-things";

pub async fn database_url(backend: Backend, dir: &std::path::Path) -> String {
    match backend {
        Backend::Sqlite => format!("sqlite://{}/autodl.db", dir.display()),
        Backend::Postgres => {
            let base = std::env::var("AUTODL_TEST_PG_URL").expect(
                "AUTODL_TEST_PG_URL is not set: run the suite with scripts/test.sh, which starts a throwaway PostgreSQL",
            );
            let name = format!("t_{}", uuid::Uuid::new_v4().simple());
            let admin = sqlx::PgPool::connect(&format!("{base}/postgres"))
                .await
                .expect("connect to test PostgreSQL");
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&admin)
                .await
                .expect("create test database");
            admin.close().await;
            format!("{base}/{name}")
        }
    }
}

pub async fn spawn_app(backend: Backend) -> TestApp {
    spawn_app_with(backend, |_| {}).await
}

pub async fn spawn_app_with(backend: Backend, tweak: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_app_on(backend, tweak, Arc::new(SystemClock)).await
}

/// A server on a manual clock whose scheduler runs only when the test says so
/// ([`TestApp::runner`]): time-dependent behaviour is tested without waiting.
pub async fn spawn_app_on_clock(
    backend: Backend,
    tweak: impl FnOnce(&mut Settings),
) -> (TestApp, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms() / 1000 * 1000));
    let app = spawn_app_on(
        backend,
        |s| {
            s.run_scheduler = false;
            tweak(s)
        },
        clock.clone(),
    )
    .await;
    (app, clock)
}

async fn spawn_app_on(
    backend: Backend,
    tweak: impl FnOnce(&mut Settings),
    clock: Arc<dyn Clock>,
) -> TestApp {
    autodl_server::telemetry::init();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        database_url: database_url(backend, dir.path()).await,
        jwt_secret: "test-secret-test-secret-test-secret".into(),
        site_root: dir.path().join("site"),
        db_max_connections: 4,
        schedule_interval_ms: 200,
        storage_url: format!("file://{}/objects", dir.path().display()),
        ..Settings::default()
    };
    tweak(&mut settings);
    let store = store::open(&settings.database_url, settings.db_max_connections)
        .await
        .expect("open store");
    let app = Application::build_with(settings, Arc::clone(&store), clock)
        .await
        .expect("build app");
    let address = format!("http://127.0.0.1:{}", app.port());
    let state = app.state.clone();
    let server = app.handle();
    tokio::spawn(app.run_until_stopped());
    TestApp {
        address,
        state,
        server,
        dir: std::sync::Arc::new(dir),
    }
}

/// A logged-in browser-like client: cookie jar plus the CSRF token it must echo.
#[derive(Clone)]
pub struct Session {
    pub client: Client,
    pub csrf: String,
    pub token: String,
    pub user: Value,
}

impl TestApp {
    /// Stops this server at once, as a crash would: open requests are cut and its scheduler
    /// ends (the database stays).
    pub async fn kill(&self) {
        self.server.stop(false).await;
    }

    /// A new server on the same database, address and clock, as after a restart.
    pub async fn restart(&self) -> TestApp {
        self.restart_with(|_| {}).await
    }

    /// A restart with other settings.
    pub async fn restart_with(&self, tweak: impl FnOnce(&mut Settings)) -> TestApp {
        let mut settings = self.state.settings.clone();
        tweak(&mut settings);
        let store = store::open(&settings.database_url, settings.db_max_connections)
            .await
            .expect("open store");
        let app = Application::build_with(settings, store, self.state.clock.clone())
            .await
            .expect("restart app");
        let state = app.state.clone();
        let server = app.handle();
        tokio::spawn(app.run_until_stopped());
        TestApp {
            address: self.address.clone(),
            state,
            server,
            dir: self.dir.clone(),
        }
    }

    /// A scheduler runner on this server's state, for tests that drive cycles themselves.
    pub fn runner(&self) -> Runner {
        Runner::new(&self.state, std::time::Duration::from_millis(200))
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
    }

    /// A client that never reuses a connection the server may be closing: actix ends idle
    /// keep-alive connections after 5 s, and a request sent on one as it closes fails with an
    /// incomplete message.
    pub fn client() -> Client {
        Client::builder()
            .cookie_store(true)
            .pool_idle_timeout(std::time::Duration::from_secs(2))
            .build()
            .unwrap()
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Response {
        Client::new()
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// Signs up a new organization owner and returns their session.
    pub async fn signup(&self, email: &str, tenant: &str) -> Session {
        let client = Self::client();
        let res = client
            .post(self.url("/api/v1/auth/signup"))
            .json(&json!({"email": email, "password": PASSWORD, "tenant_name": tenant}))
            .send()
            .await
            .unwrap();
        Self::session_from(client, res).await
    }

    pub async fn login(&self, email: &str, password: &str) -> Session {
        let client = Self::client();
        let res = client
            .post(self.url("/api/v1/auth/login"))
            .json(&json!({"email": email, "password": password}))
            .send()
            .await
            .unwrap();
        Self::session_from(client, res).await
    }

    pub async fn session_from(client: Client, res: Response) -> Session {
        assert!(
            res.status().is_success(),
            "expected success, got {}",
            res.status()
        );
        let csrf = res
            .cookies()
            .find(|c| c.name() == "autodl_csrf")
            .map(|c| c.value().to_owned())
            .expect("csrf cookie");
        let body: Value = res.json().await.unwrap();
        Session {
            client,
            csrf,
            token: body["token"].as_str().unwrap().to_owned(),
            user: body["user"].clone(),
        }
    }

    /// Invites `email` into `owner`'s organization with `role` and signs them up.
    pub async fn invite_and_join(&self, owner: &Session, email: &str, role: &str) -> Session {
        let inv: Value = owner
            .send(
                self,
                Method::POST,
                "/api/v1/tenant/invitations",
                Some(json!({"email": email, "role": role})),
            )
            .await
            .json()
            .await
            .unwrap();
        let client = Self::client();
        let res = client
            .post(self.url("/api/v1/auth/signup"))
            .json(&json!({"email": email, "password": PASSWORD, "invitation": inv["token"]}))
            .send()
            .await
            .unwrap();
        Self::session_from(client, res).await
    }

    /// A platform admin session that registered two nodes: `node-a` with 4 x A100-40G in zone
    /// z1 and `node-b` with 4 x A40 (48 GiB) in zone z2.
    pub async fn operator_with_nodes(&self) -> Session {
        let op = self.operator().await;
        for body in [
            json!({"id": "node-a", "zone": "z1", "cpu": 64, "memory": "512GiB", "gpus": {"type": "A100-40G", "count": 4, "memory": "40GiB"}}),
            json!({"id": "node-b", "zone": "z2", "cpu": 64, "memory": "512GiB", "gpus": [{"type": "A40", "memory": "48GiB"}, {"type": "A40", "memory": "48GiB"}, {"type": "A40", "memory": "48GiB"}, {"type": "A40", "memory": "48GiB"}]}),
        ] {
            let res = op
                .send(self, Method::POST, "/api/v1/admin/nodes", Some(body))
                .await;
            assert_eq!(res.status(), StatusCode::CREATED);
        }
        op
    }

    /// A fresh agent registration token, made by the operator `op`.
    pub async fn registration_token(&self, op: &Session, name: &str) -> String {
        let tok: Value = op
            .send(
                self,
                Method::POST,
                "/api/v1/admin/registration-tokens",
                Some(json!({"name": name})),
            )
            .await
            .json()
            .await
            .unwrap();
        tok["token"].as_str().unwrap().to_owned()
    }

    /// A platform administrator's session.
    pub async fn operator(&self) -> Session {
        let op = self.signup("ops@example.com", "Operators").await;
        self.make_platform_admin(&op.id()).await;
        op
    }

    pub async fn make_platform_admin(&self, user_id: &str) {
        assert!(self
            .state
            .store
            .set_user_flags(user_id, None, Some(true))
            .await
            .unwrap());
    }
}

impl Session {
    pub fn id(&self) -> String {
        self.user["id"].as_str().unwrap().to_owned()
    }

    /// A cookie-authenticated request with the CSRF header, as the web app sends it.
    pub fn request(&self, app: &TestApp, method: Method, path: &str) -> RequestBuilder {
        self.client
            .request(method, app.url(path))
            .header("X-CSRF-Token", &self.csrf)
    }

    pub async fn send(
        &self,
        app: &TestApp,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Response {
        let mut req = self.request(app, method, path);
        if let Some(b) = body {
            req = req.json(&b);
        }
        req.send().await.unwrap()
    }

    pub async fn get(&self, app: &TestApp, path: &str) -> Value {
        let res = self.send(app, Method::GET, path, None).await;
        assert_eq!(res.status(), StatusCode::OK, "GET {path}");
        res.json().await.unwrap()
    }

    /// The Prometheus text of `/metrics`, which needs a platform administrator.
    pub async fn prometheus(&self, app: &TestApp) -> String {
        let res = self.send(app, Method::GET, "/metrics", None).await;
        assert_eq!(res.status(), StatusCode::OK, "GET /metrics");
        res.text().await.unwrap()
    }
}

/// Asserts an error answer: status, the JSON error shape, and its code.
pub async fn assert_error(res: Response, status: StatusCode, code: &str) -> Value {
    assert_eq!(res.status(), status, "unexpected status");
    let body: Value = res.json().await.expect("error body is JSON");
    assert_eq!(body["error"]["code"], code, "body: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "body: {body}"
    );
    body
}

/// Writes one test function per backend for each named async test body.
/// A server process (the real binary) on the test's database, killed (SIGKILL) when dropped:
/// what a crash or a second server does, which an in-process server cannot show.
pub struct ServerProcess {
    child: std::process::Child,
    pub address: String,
}

impl ServerProcess {
    pub fn start(app: &TestApp) -> ServerProcess {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let s = &app.state.settings;
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_autodl-server"))
            .arg("serve")
            .env("AUTODL_LISTEN", format!("127.0.0.1:{port}"))
            .env("AUTODL_DATABASE_URL", &s.database_url)
            .env("AUTODL_JWT_SECRET", &s.jwt_secret)
            .env("AUTODL_STORAGE_URL", &s.storage_url)
            .env("AUTODL_SITE_ROOT", &s.site_root)
            // The timer alone would take up to 2 s: what is faster comes from the wake-ups.
            .env("AUTODL_SCHEDULE_INTERVAL_MS", "2000")
            .env("AUTODL_DB_MAX_CONNECTIONS", "4")
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start a server process");
        ServerProcess {
            child,
            address: format!("http://127.0.0.1:{port}"),
        }
    }

    pub async fn role(&self) -> Option<String> {
        let res = reqwest::get(format!("{}/healthz", self.address))
            .await
            .ok()?;
        let body: Value = res.json().await.ok()?;
        body["role"].as_str().map(str::to_owned)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends a signal by name ("STOP", "CONT") to the server process.
    pub fn signal(&self, name: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{name} failed");
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test]
                async fn sqlite() {
                    super::$name($crate::helpers::Backend::Sqlite).await
                }
                #[tokio::test]
                async fn postgres() {
                    super::$name($crate::helpers::Backend::Postgres).await
                }
            }
        )*
    };
}

/// Moves the manual `clock` forward to `to` as a working leader lives through the time: a
/// cycle every 5 s. (A stretch of the clock without cycles is one the server was not running
/// through, a pause, and no node is judged lost for silence it could not hear.)
pub async fn live_until(runner: &mut Runner, clock: &ManualClock, to: i64) {
    let mut t = clock.now_ms();
    while t < to {
        t = (t + 5_000).min(to);
        clock.set(t);
        runner.cycle(t).await.unwrap();
    }
}

/// A case this machine cannot run says that it skipped. CI runs the suite as root with Docker,
/// PyTorch and mountable file systems (`scripts/test.sh`), so there a skip is a failure: a case
/// CI can run never passes there without running.
pub fn skip(reason: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "not skipped under CI, which can run this case: {reason}"
    );
    eprintln!("skipped: {reason}");
}

/// A small filesystem of its own (for a database, object storage), mounted for one test and
/// unmounted after it. `None` where this process may not mount (not root): the caller skips.
pub struct SmallDisk {
    pub path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    pub fn mount(size: &str) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| SmallDisk {
            path: dir.path().to_path_buf(),
            _dir: dir,
        })
    }

    /// Writes zeros until the disk is full; returns the file to remove for room again.
    pub fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let p = self.path.join("filler");
        let mut f = std::fs::File::create(&p).unwrap();
        let block = vec![0u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
        // The last partial block too.
        while f.write_all(&[0u8; 512]).is_ok() {}
        let _ = f.sync_all();
        p
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}
