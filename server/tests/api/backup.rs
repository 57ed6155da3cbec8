//! Backups and restores: SQLite by `autodl-server backup|restore`, PostgreSQL by its own
//! `pg_dump`/`pg_restore` as docs/operations.md says. Tasks, keys and quotas come back as
//! they were at the backup; what changed later is gone from the restored database only.

use std::process::Command;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::admin_cli::cli;
use crate::helpers::{spawn_app_with, Backend, Session, TestApp};

crate::on_both_backends!(a_backup_restores_tasks_keys_and_quotas);

pub fn pg_tool(name: &str) -> String {
    let mut dirs: Vec<_> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL's binaries")
        .flatten()
        .map(|e| e.path().join("bin").join(name))
        .filter(|p| p.exists())
        .collect();
    dirs.sort();
    dirs.pop().expect(name).display().to_string()
}

fn run(mut c: Command) {
    let out = c.output().expect("run");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Submits a one-GPU task of `s` named `name`; its id.
pub async fn submit(app: &TestApp, s: &Session, name: &str) -> String {
    let res = s
        .send(
            app,
            Method::POST,
            "/api/v1/tasks",
            Some(json!({"name": name, "image": "busybox", "command": "true",
                "resources": {"gpu": {"count": 1}}})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn a_backup_restores_tasks_keys_and_quotas(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator_with_nodes().await;
    let ada = app.signup("ada@example.com", "Lab").await;
    let kept = submit(&app, &ada, "kept").await;
    let res = ada
        .send(
            &app,
            Method::POST,
            "/api/v1/api-keys",
            Some(json!({"name": "ci"})),
        )
        .await;
    let key = res.json::<Value>().await.unwrap()["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let tenant = ada.user["tenant_id"].as_str().unwrap().to_owned();
    let res = op
        .send(
            &app,
            Method::PUT,
            &format!("/api/v1/admin/tenants/{tenant}/quota"),
            Some(json!({"max_gpus": 3})),
        )
        .await;
    assert!(res.status().is_success(), "{}", res.text().await.unwrap());

    // The backup is taken while the server runs; then more happens.
    let url = app.state.settings.database_url.clone();
    let file = app.dir.path().join("autodl.backup");
    match b {
        Backend::Sqlite => {
            let out = cli(&url, &["backup", file.to_str().unwrap()]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let again = cli(&url, &["backup", file.to_str().unwrap()]);
            assert!(
                !again.status.success(),
                "an existing file is not overwritten"
            );
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&file).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "the backup is private");
        }
        Backend::Postgres => {
            let out = cli(&url, &["backup", file.to_str().unwrap()]);
            assert!(!out.status.success());
            assert!(String::from_utf8_lossy(&out.stderr).contains("pg_dump"));
            let mut c = Command::new(pg_tool("pg_dump"));
            c.args(["-Fc", "-f", file.to_str().unwrap(), &url]);
            run(c);
        }
    }
    let later = submit(&app, &ada, "later").await;
    app.kill().await;

    // Put back.
    match b {
        Backend::Sqlite => {
            let junk = app.dir.path().join("junk");
            std::fs::write(&junk, b"not a database").unwrap();
            let out = cli(&url, &["restore", junk.to_str().unwrap()]);
            assert!(!out.status.success(), "a file that is no backup is refused");
            let out = cli(&url, &["restore", file.to_str().unwrap()]);
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(said.contains("before-restore"), "{said}");
        }
        Backend::Postgres => {
            let mut c = Command::new(pg_tool("pg_restore"));
            c.args([
                "--clean",
                "--if-exists",
                "--no-owner",
                "-d",
                &url,
                file.to_str().unwrap(),
            ]);
            run(c);
        }
    }
    let app = app.restart().await;
    let ada = app.login("ada@example.com", crate::helpers::PASSWORD).await;
    let t = ada.get(&app, &format!("/api/v1/tasks/{kept}")).await;
    assert_eq!(t["name"], "kept");
    let res = ada
        .send(&app, Method::GET, &format!("/api/v1/tasks/{later}"), None)
        .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND, "made after the backup");
    let me = reqwest::Client::new()
        .get(app.url("/api/v1/me"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(me.status(), StatusCode::OK, "the key works again");
    let quota = ada.get(&app, "/api/v1/tenant/quota").await;
    assert_eq!(quota["max_gpus"], 3, "{quota}");
}
