//! `autodl-server admin ...` from the shell, against the same stores the server uses.

use std::process::Command;

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{assert_error, database_url, spawn_app_with, Backend};

crate::on_both_backends!(create_admin_and_reset_password);

pub fn cli(url: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_autodl-server"))
        .env("AUTODL_DATABASE_URL", url)
        .env("RUST_LOG", "warn")
        .args(args)
        .output()
        .expect("run autodl-server")
}

async fn create_admin_and_reset_password(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = database_url(b, dir.path()).await;
    let out = cli(
        &url,
        &[
            "admin",
            "create-admin",
            "--email",
            "root@example.com",
            "--password",
            "Operat0r-secret!",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(
        &url,
        &[
            "admin",
            "create-admin",
            "--email",
            "bad",
            "--password",
            "Operat0r-secret!",
        ],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a valid email"));

    let app = spawn_app_with(b, |s| s.database_url = url.clone()).await;
    let s = app.login("root@example.com", "Operat0r-secret!").await;
    assert_eq!(s.user["platform_admin"], true);
    assert_eq!(s.user["tenant_name"], "Operators");
    s.get(&app, "/api/v1/admin/tenants").await;

    let out = cli(
        &url,
        &[
            "admin",
            "reset-password",
            "--email",
            "root@example.com",
            "--password",
            "N3w-operator-pass",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        s.send(&app, reqwest::Method::GET, "/api/v1/me", None)
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );
    let res = app
        .post_json(
            "/api/v1/auth/login",
            &json!({"email": "root@example.com", "password": "Operat0r-secret!"}),
        )
        .await;
    assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    app.login("root@example.com", "N3w-operator-pass").await;
    let out = cli(
        &url,
        &[
            "admin",
            "reset-password",
            "--email",
            "ghost@example.com",
            "--password",
            "N3w-operator-pass",
        ],
    );
    assert!(!out.status.success());

    // An existing member made a platform administrator, and back, from the shell.
    let ada = app.signup("ada@example.com", "Lab").await;
    assert_eq!(ada.get(&app, "/api/v1/me").await["platform_admin"], false);
    let out = cli(&url, &["admin", "make-admin", "--email", "ada@example.com"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(ada.get(&app, "/api/v1/me").await["platform_admin"], true);
    ada.get(&app, "/api/v1/admin/tenants").await;
    let out = cli(
        &url,
        &[
            "admin",
            "make-admin",
            "--email",
            "ada@example.com",
            "--revoke",
        ],
    );
    assert!(out.status.success());
    assert_eq!(ada.get(&app, "/api/v1/me").await["platform_admin"], false);
    let out = cli(
        &url,
        &["admin", "make-admin", "--email", "ghost@example.com"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no account with email"));

    // The demo agents' own organization and account are the platform's, not people's: the
    // administrators' lists leave them out.
    let shutdown = tokio_util::sync::CancellationToken::new();
    let data = tempfile::tempdir().unwrap();
    let agents = autodl_server::demo::start_agents(&app.state, data.path(), shutdown.clone())
        .await
        .unwrap();
    let root = app.login("root@example.com", "N3w-operator-pass").await;
    let tenants = root.get(&app, "/api/v1/admin/tenants").await.to_string();
    assert!(tenants.contains("Operators"), "{tenants}");
    assert!(!tenants.contains("demo agents"), "{tenants}");
    let users = root.get(&app, "/api/v1/admin/users").await.to_string();
    assert!(users.contains("root@example.com"), "{users}");
    assert!(!users.contains("demo-agents@"), "{users}");
    shutdown.cancel();
    drop(agents);
}
