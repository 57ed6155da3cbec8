//! The audit trail: what people do is recorded with who, when and from where; each
//! organization's managers see their own records, platform administrators everyone's; and the
//! hash chain holds over thousands of concurrent appends, while a record changed in the
//! database afterwards is found by `autodl-server audit verify`.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::admin_cli::cli;
use crate::helpers::{assert_error, spawn_app, Backend, Session, TestApp, PASSWORD};

crate::on_both_backends!(
    actions_are_recorded_and_each_organization_sees_its_own,
    the_chain_holds_after_ten_thousand_actions_and_tampering_is_found,
    changes_to_shared_things_are_recorded,
);

async fn records(app: &TestApp, s: &Session, query: &str) -> Vec<Value> {
    let res = s
        .send(app, Method::GET, &format!("/api/v1/audit?{query}"), None)
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let page: Value = res.json().await.unwrap();
    page["records"].as_array().unwrap().clone()
}

fn actions(list: &[Value]) -> Vec<String> {
    list.iter()
        .map(|r| r["action"].as_str().unwrap().to_owned())
        .collect()
}

async fn actions_are_recorded_and_each_organization_sees_its_own(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.operator_with_nodes().await;
    let ada = app.signup("ada@example.com", "Lab").await;
    let wrong = TestApp::client()
        .post(app.url("/api/v1/auth/login"))
        .json(&json!({"email": "ada@example.com", "password": "not-her-password"}))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let ada = {
        drop(ada);
        app.login("ada@example.com", PASSWORD).await
    };
    let key: Value = ada
        .send(
            &app,
            Method::POST,
            "/api/v1/api-keys",
            Some(json!({"name": "laptop"})),
        )
        .await
        .json()
        .await
        .unwrap();
    let res = ada
        .send(
            &app,
            Method::DELETE,
            &format!("/api/v1/api-keys/{}", key["info"]["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let bob = app.invite_and_join(&ada, "bob@example.com", "member").await;
    let res = ada
        .send(
            &app,
            Method::PATCH,
            &format!("/api/v1/tenant/members/{}", bob.id()),
            Some(json!({"role": "admin"})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = ada
        .send(
            &app,
            Method::PUT,
            &format!("/api/v1/tenant/members/{}/quota", bob.id()),
            Some(json!({"max_gpus": 2})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = op
        .send(
            &app,
            Method::POST,
            "/api/v1/admin/nodes/node-a/cordon",
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let task: Value = bob
        .send(
            &app,
            Method::POST,
            "/api/v1/tasks",
            Some(
                json!({"name": "bobs", "image": "busybox", "command": "true",
                "resources": {"gpu": {"count": 1}}}),
            ),
        )
        .await
        .json()
        .await
        .unwrap();
    let task_id = task["id"].as_str().unwrap();
    // Bob cancelling his own task is not audited; Ada cancelling it is.
    let res = ada
        .send(
            &app,
            Method::POST,
            &format!("/api/v1/tasks/{task_id}/cancel"),
            Some(json!({})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);

    // The organization's view: its own records, newest first, nothing of the platform's.
    let lab = records(&app, &ada, "").await;
    let got = actions(&lab);
    for want in [
        "auth.sign_up",
        "auth.sign_in_failed",
        "auth.sign_in",
        "api_key.created",
        "api_key.revoked",
        "member.invited",
        "member.changed",
        "member.quota_changed",
        "task.cancelled_by_other",
    ] {
        assert!(got.iter().any(|a| a == want), "{want} missing from {got:?}");
    }
    assert!(!got.iter().any(|a| a.starts_with("node.")), "{got:?}");
    assert!(lab.iter().all(|r| r["tenant_id"] == ada.user["tenant_id"]));
    let seqs: Vec<i64> = lab.iter().map(|r| r["seq"].as_i64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] > w[1]),
        "newest first: {seqs:?}"
    );
    let cancel = &lab[0];
    assert_eq!(cancel["action"], "task.cancelled_by_other");
    assert_eq!(cancel["actor_email"], "ada@example.com");
    assert_eq!(cancel["target"], format!("task {task_id}"));
    assert_eq!(cancel["detail"]["owner"], "bob@example.com");
    assert_eq!(cancel["ip"], "127.0.0.1");
    let failed = lab
        .iter()
        .find(|r| r["action"] == "auth.sign_in_failed")
        .unwrap();
    assert_eq!(failed["actor_email"], "ada@example.com");
    assert_eq!(failed["detail"]["reason"], "wrong email or password");
    let role = lab
        .iter()
        .find(|r| r["action"] == "member.changed")
        .unwrap();
    assert_eq!(
        role["detail"]["role"],
        json!({"from": "member", "to": "admin"})
    );
    assert_eq!(role["target"], "user bob@example.com");

    // Filters: a family of actions, one person, a time window; bad input is a clear 400.
    let auth = records(&app, &ada, "action=auth.").await;
    assert!(!auth.is_empty() && actions(&auth).iter().all(|a| a.starts_with("auth.")));
    let keys = records(&app, &ada, "action=api_key.revoked").await;
    assert_eq!(actions(&keys), ["api_key.revoked"]);
    let bobs = records(&app, &ada, "actor=Bob@Example.com").await;
    assert!(!bobs.is_empty() && bobs.iter().all(|r| r["actor_email"] == "bob@example.com"));
    assert!(records(&app, &ada, "since=2999-01-01").await.is_empty());
    assert_eq!(
        records(&app, &ada, "until=2000-01-01T00:00:00Z")
            .await
            .len(),
        0
    );
    let res = ada
        .send(&app, Method::GET, "/api/v1/audit?since=yesterday", None)
        .await;
    assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    let res = ada
        .send(&app, Method::GET, "/api/v1/audit?limit=0", None)
        .await;
    assert_error(res, StatusCode::BAD_REQUEST, "validation").await;

    // Pages: `next_before` leads to the older records, none twice.
    let first: Value = ada
        .send(&app, Method::GET, "/api/v1/audit?limit=3", None)
        .await
        .json()
        .await
        .unwrap();
    let before = first["next_before"].as_i64().unwrap();
    let rest = records(&app, &ada, &format!("before={before}&limit=1000")).await;
    assert_eq!(3 + rest.len(), lab.len());
    assert!(rest.iter().all(|r| r["seq"].as_i64().unwrap() < before));

    // CSV for spreadsheets: one line per record, with the header.
    let res = ada
        .send(
            &app,
            Method::GET,
            "/api/v1/audit?format=csv&action=auth.",
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/csv"));
    let csv = res.text().await.unwrap();
    assert!(csv.starts_with("seq,at,tenant_id,actor_id,actor_email,action,"));
    assert_eq!(csv.lines().count(), 1 + auth.len());
    assert!(csv.contains("\"auth.sign_in_failed\""));

    // Another organization's trail is not Ada's to read; members see none.
    let res = ada
        .send(
            &app,
            Method::GET,
            &format!(
                "/api/v1/audit?tenant={}",
                op.user["tenant_id"].as_str().unwrap()
            ),
            None,
        )
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    let carol = app
        .invite_and_join(&ada, "carol@example.com", "member")
        .await;
    let res = carol.send(&app, Method::GET, "/api/v1/audit", None).await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    // Bob, an admin now, sees the organization's trail too.
    assert!(records(&app, &bob, "action=auth.sign_up").await.len() >= 2);

    // The platform's administrators see everything, the nodes too.
    let all = records(&app, &op, "limit=1000").await;
    assert!(all.len() > lab.len());
    let registered = all
        .iter()
        .filter(|r| r["action"] == "node.registered")
        .count();
    assert_eq!(registered, 2);
    let cordon = all
        .iter()
        .find(|r| r["action"] == "node.status_changed")
        .unwrap();
    assert_eq!(cordon["target"], "node node-a");
    assert_eq!(cordon["detail"]["action"], "cordon");
    assert_eq!(cordon["tenant_id"], Value::Null);
    let only_lab = records(
        &app,
        &op,
        &format!(
            "tenant={}&limit=1000",
            ada.user["tenant_id"].as_str().unwrap()
        ),
    )
    .await;
    assert_eq!(
        only_lab.len(),
        lab.len() + 2,
        "carol's sign-up and invitation"
    );

    // And the chain holds.
    let out = cli(&app.state.settings.database_url, &["audit", "verify"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains(&format!("{} records", all.len())), "{said}");
}

async fn the_chain_holds_after_ten_thousand_actions_and_tampering_is_found(b: Backend) {
    use autodl_server::store::NewAuditRecord;
    const WRITERS: usize = 8;
    const EACH: usize = 1250;
    let app = spawn_app(b).await;
    // Eight writers at once, as many handlers (or replicas) would: the chain must not fork.
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let store = app.state.store.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..EACH {
                let r = NewAuditRecord {
                    tenant_id: Some(format!("tenant-{}", w % 3)),
                    actor_id: Some(format!("user-{w}")),
                    actor_email: Some(format!("user{w}@example.com")),
                    action: "api_key.created".into(),
                    target: format!("api key {w}-{i}"),
                    detail: json!({ "name": format!("key {i}") }).to_string(),
                    ip: Some("10.1.2.3".into()),
                };
                store
                    .append_audit(&r, 1_700_000_000_000 + i as i64)
                    .await
                    .unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let url = app.state.settings.database_url.clone();
    let out = cli(&url, &["audit", "verify"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("10000 records"), "{said}");

    // Someone with the database's password rewrites one record to hide what was done.
    let tamper = "UPDATE audit_log SET actor_email = 'someone-else@example.com' WHERE seq = 4321";
    match b {
        Backend::Sqlite => {
            let db = sqlx::SqlitePool::connect(&url).await.unwrap();
            sqlx::query(tamper).execute(&db).await.unwrap();
        }
        Backend::Postgres => {
            let db = sqlx::PgPool::connect(&url).await.unwrap();
            sqlx::query(tamper).execute(&db).await.unwrap();
        }
    }
    let out = cli(&url, &["audit", "verify"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("broken at record 4321"), "{said}");

    // A record removed from earlier in the trail is found (the first break is named).
    let remove = "DELETE FROM audit_log WHERE seq = 777";
    match b {
        Backend::Sqlite => {
            let db = sqlx::SqlitePool::connect(&url).await.unwrap();
            sqlx::query(remove).execute(&db).await.unwrap();
        }
        Backend::Postgres => {
            let db = sqlx::PgPool::connect(&url).await.unwrap();
            sqlx::query(remove).execute(&db).await.unwrap();
        }
    }
    let out = cli(&url, &["audit", "verify"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("broken at record 777"), "{said}");
}

/// What one member does to what others share is on record: a colleague's sweep cancelled, a
/// shared object replaced or deleted, an invitation revoked.
async fn changes_to_shared_things_are_recorded(b: Backend) {
    let app = spawn_app(b).await;
    let ada = app.signup("ada@example.com", "Lab").await;
    let bob = app.invite_and_join(&ada, "bob@example.com", "member").await;
    let carol = app
        .invite_and_join(&ada, "carol@example.com", "member")
        .await;
    let sweep: Value = bob
        .send(
            &app,
            Method::POST,
            "/api/v1/sweeps",
            Some(json!({"name": "lr",
                "parameters": {"lr": [0.1, 0.01]},
                "template": {"name": "t", "image": "i", "command": "echo ${lr}"}})),
        )
        .await
        .json()
        .await
        .unwrap();
    let sweep_id = sweep["id"].as_str().unwrap_or_else(|| panic!("{sweep}"));
    let res = carol
        .send(
            &app,
            Method::POST,
            &format!("/api/v1/sweeps/{sweep_id}/cancel"),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let put = |s: &Session, body: &'static str| {
        s.request(
            &app,
            Method::PUT,
            "/api/v1/objects/autodl/datasets/shared.bin",
        )
        .header("Content-Type", "application/octet-stream")
        .body(body)
        .send()
    };
    assert_eq!(
        put(&bob, "bob's data").await.unwrap().status(),
        StatusCode::CREATED
    );
    assert_eq!(
        put(&carol, "carol's").await.unwrap().status(),
        StatusCode::CREATED
    );
    let res = carol
        .send(
            &app,
            Method::DELETE,
            "/api/v1/objects/autodl/datasets/shared.bin",
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let inv: Value = ada
        .send(
            &app,
            Method::POST,
            "/api/v1/tenant/invitations",
            Some(json!({"email": "dan@example.com", "role": "member"})),
        )
        .await
        .json()
        .await
        .unwrap();
    let res = ada
        .send(
            &app,
            Method::DELETE,
            &format!("/api/v1/tenant/invitations/{}", inv["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    let lab = records(&app, &ada, "").await;
    let find = |action: &str| {
        lab.iter()
            .find(|r| r["action"] == action)
            .unwrap_or_else(|| panic!("{action} missing from {:?}", actions(&lab)))
            .clone()
    };
    let r = find("sweep.cancelled_by_other");
    assert_eq!(r["actor_email"], "carol@example.com");
    assert_eq!(r["detail"]["owner"], "bob@example.com");
    let r = find("object.replaced");
    assert_eq!(r["actor_email"], "carol@example.com");
    assert_eq!(r["target"], "object autodl/datasets/shared.bin");
    let r = find("object.deleted");
    assert_eq!(r["actor_email"], "carol@example.com");
    let r = find("member.invitation_revoked");
    assert_eq!(r["actor_email"], "ada@example.com");
}
