// Each benchmark binary compiles this module and uses a different part of it.
#![allow(dead_code)]

//! What every benchmark needs: a real server on a random port over SQLite, or over
//! PostgreSQL when `AUTODL_BENCH_PG_URL` names a cluster (a fresh database is made in it).

use autodl_server::config::Settings;
use autodl_server::startup::Application;
use autodl_server::state::AppState;

pub struct BenchServer {
    pub base: String,
    pub backend: &'static str,
    pub state: actix_web::web::Data<AppState>,
    pub dir: tempfile::TempDir,
}

pub fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub async fn start() -> anyhow::Result<BenchServer> {
    start_with(|_| {}).await
}

pub async fn start_with(tweak: impl FnOnce(&mut Settings)) -> anyhow::Result<BenchServer> {
    // Server logs only when asked for (RUST_LOG=warn ...).
    if std::env::var_os("RUST_LOG").is_some() {
        autodl_server::telemetry::init();
    }
    let dir = tempfile::tempdir()?;
    let (backend, url) = database(dir.path()).await?;
    let mut settings = Settings {
        listen: "127.0.0.1:0".parse()?,
        database_url: url,
        jwt_secret: "bench-secret".into(),
        site_root: dir.path().into(),
        db_max_connections: 16,
        storage_url: format!("file://{}/objects", dir.path().display()),
        ..Settings::default()
    };
    tweak(&mut settings);
    let app = Application::build(settings).await?;
    let base = format!("http://127.0.0.1:{}", app.port());
    let state = app.state.clone();
    tokio::spawn(app.run_until_stopped());
    Ok(BenchServer {
        base,
        backend,
        state,
        dir,
    })
}

/// The `p` percentile (nearest rank) of `v`, which it sorts; 0 when empty.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[(((p / 100.0) * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1]
}

/// Signs a user up (a new organization); the answer has `token` and `user`.
pub async fn signup(
    http: &reqwest::Client,
    base: &str,
    email: &str,
    org: &str,
) -> anyhow::Result<serde_json::Value> {
    Ok(http
        .post(format!("{base}/api/v1/auth/signup"))
        .json(
            &serde_json::json!({"email": email, "password": "Bench-passw0rd", "tenant_name": org}),
        )
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// A platform administrator's bearer token.
pub async fn operator(server: &BenchServer, http: &reqwest::Client) -> anyhow::Result<String> {
    let op = signup(http, &server.base, "ops@example.com", "Ops").await?;
    server
        .state
        .store
        .set_user_flags(
            op["user"]["id"].as_str().unwrap_or_default(),
            None,
            Some(true),
        )
        .await?;
    Ok(op["token"].as_str().unwrap_or_default().to_owned())
}

/// A fresh database: a new one in the PostgreSQL cluster `AUTODL_BENCH_PG_URL` names, or a
/// SQLite file in `dir`. Returns the backend's name and the URL.
pub async fn database(dir: &std::path::Path) -> anyhow::Result<(&'static str, String)> {
    Ok(match std::env::var("AUTODL_BENCH_PG_URL") {
        Ok(base) => {
            let name = format!("bench_{}", uuid::Uuid::new_v4().simple());
            let admin = sqlx::PgPool::connect(&format!("{base}/postgres")).await?;
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&admin)
                .await?;
            ("postgres", format!("{base}/{name}"))
        }
        Err(_) => ("sqlite", format!("sqlite://{}/bench.db", dir.display())),
    })
}
