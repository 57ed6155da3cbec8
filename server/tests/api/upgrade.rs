//! Upgrading: a database written by the previous release (by its own binary, through its own
//! API: `scripts/release-fixture.sh`) is opened by this one, which brings its schema forward
//! with the migrations added since, and nothing stored is lost. Migrations only move forward:
//! the released ones are checked by their checksums on open, so one edited after its release
//! fails here.

use std::path::PathBuf;
use std::process::Command;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::admin_cli::cli;
use crate::backup::pg_tool;
use crate::helpers::{database_url, spawn_app_with, Backend, TestApp};

crate::on_both_backends!(a_database_of_the_previous_release_upgrades_with_nothing_lost);

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

async fn a_database_of_the_previous_release_upgrades_with_nothing_lost(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let (url, about) = match b {
        Backend::Sqlite => {
            let db = dir.path().join("autodl.db");
            std::fs::copy(fixtures().join("release.sqlite"), &db).unwrap();
            (format!("sqlite://{}", db.display()), "release-sqlite.json")
        }
        Backend::Postgres => {
            let url = database_url(b, dir.path()).await;
            let out = Command::new(pg_tool("psql"))
                .args([&url, "-q", "-v", "ON_ERROR_STOP=1", "-f"])
                .arg(fixtures().join("release.pg.sql"))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            (url, "release-postgres.json")
        }
    };
    let f: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join(about)).unwrap()).unwrap();
    let app = spawn_app_with(b, |s| s.database_url = url.clone()).await;
    let s = |v: &Value| v.as_str().unwrap().to_owned();

    // The researcher signs in with the password she set then; her key still works.
    let ada = app
        .login(
            &s(&f["researcher"]["email"]),
            &s(&f["researcher"]["password"]),
        )
        .await;
    let me: Value = TestApp::client()
        .get(app.url("/api/v1/me"))
        .bearer_auth(s(&f["researcher"]["api_key"]))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(me["email"], f["researcher"]["email"]);
    assert_eq!(me["tenant_id"], f["researcher"]["tenant_id"]);

    // Her tasks, as they were: one waiting for its node, one cancelled.
    let kept = ada
        .get(&app, &format!("/api/v1/tasks/{}", s(&f["tasks"]["kept"])))
        .await;
    // (The old server had placed it on the node, which no agent runs: placed or queued again.)
    assert!(
        matches!(kept["state"].as_str(), Some("scheduled" | "queued")),
        "{kept}"
    );
    assert_eq!(kept["name"], "kept");
    let cancelled = ada
        .get(
            &app,
            &format!("/api/v1/tasks/{}", s(&f["tasks"]["cancelled"])),
        )
        .await;
    assert_eq!(cancelled["state"], "cancelled");
    let events = ada
        .get(
            &app,
            &format!("/api/v1/tasks/{}/events", s(&f["tasks"]["cancelled"])),
        )
        .await;
    assert!(events.as_array().unwrap().len() >= 2, "{events}");

    // The member she invited, with the role she gave.
    let members = ada.get(&app, "/api/v1/tenant/members").await;
    let bob = members
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["email"] == f["member"])
        .unwrap();
    assert_eq!(bob["role"], "admin");

    // The operator: the organization's quota and the node.
    let op = app
        .login(&s(&f["operator"]["email"]), &s(&f["operator"]["password"]))
        .await;
    let tenants = op.get(&app, "/api/v1/admin/tenants").await;
    let lab = tenants
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == f["researcher"]["tenant_id"])
        .unwrap();
    assert_eq!(lab["quota"]["max_gpus"], f["tenant_quota"]["max_gpus"]);
    assert_eq!(
        lab["quota"]["gpu_hours_per_month"].as_f64(),
        f["tenant_quota"]["gpu_hours_per_month"].as_f64()
    );
    let nodes = op.get(&app, "/api/v1/nodes").await;
    assert!(
        nodes
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["id"] == f["node"]),
        "{nodes}"
    );

    // What this release added works on the old data: the audit trail records and verifies,
    // and a task is taken.
    let res = ada
        .send(
            &app,
            Method::POST,
            "/api/v1/tasks",
            Some(
                serde_json::json!({"name": "after", "image": "busybox", "command": "true",
                "resources": {"gpu": {"count": 1}}}),
            ),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let trail = op.get(&app, "/api/v1/audit?action=auth.sign_in").await;
    assert_eq!(trail["records"].as_array().unwrap().len(), 2);
    let out = cli(&url, &["audit", "verify"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Opening it again migrates nothing more and loses nothing.
    app.kill().await;
    let again = app.restart().await;
    let ada = again
        .login(
            &s(&f["researcher"]["email"]),
            &s(&f["researcher"]["password"]),
        )
        .await;
    let list = ada.get(&again, "/api/v1/tasks").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 3, "{list}");
}
