//! Notifications by email: each person chooses their events; a task that fails and a monthly
//! GPU-hour cap nearly used reach them through a real SMTP server (aiosmtpd), and an event
//! they did not choose does not. The same events reach the organization's webhooks.

use std::process::Stdio;
use std::time::Duration;

use autodl_server::clock::Clock;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::backup::submit;
use crate::helpers::{assert_error, spawn_app, spawn_app_on_clock, Backend};
use crate::webhooks::{receiver, told};

crate::on_both_backends!(
    people_are_emailed_the_events_they_chose,
    without_a_mail_server_nobody_can_ask_for_email,
    sign_ups_are_finished_by_email_and_tell_nobody_who_has_an_account,
);

/// The test mail server: its port, and each message it takes as a JSON line.
struct Sink {
    port: u16,
    lines: Lines<BufReader<ChildStdout>>,
    _child: Child,
}

async fn sink() -> Sink {
    let python = std::env::var("AUTODL_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/api/smtp_sink.py");
    let mut child = Command::new(&python)
        .arg(script)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{python} {script}: {e}"));
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect(
            "the SMTP sink starts (needs aiosmtpd: pip install -r server/tests/requirements.txt)",
        )
        .unwrap()
        .expect("the SMTP sink says its port (needs aiosmtpd)");
    Sink {
        port: first.trim().parse().unwrap(),
        lines,
        _child: child,
    }
}

impl Sink {
    /// The next message, within 20 s.
    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
            .await
            .expect("an email arrives")
            .unwrap()
            .unwrap();
        serde_json::from_str(&line).unwrap()
    }

    /// Nothing more arrives within `wait`.
    async fn quiet(&mut self, wait: Duration) {
        if let Ok(Ok(Some(line))) = tokio::time::timeout(wait, self.lines.next_line()).await {
            panic!("unexpected email: {line}");
        }
    }
}

fn subject(mail: &Value) -> String {
    mail["data"]
        .as_str()
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Subject: "))
        .unwrap_or_default()
        .to_owned()
}

async fn people_are_emailed_the_events_they_chose(b: Backend) {
    let mut mail = sink().await;
    let port = mail.port;
    let (app, clock) = spawn_app_on_clock(b, |s| {
        s.smtp_url = Some(format!("smtp://127.0.0.1:{port}"));
        // Accounts made at once here; sign-ups by email link are tested on their own.
        s.signup_confirmation = Some(false);
        s.mail_from = "autodl <noreply@autodl.example>".into();
        s.webhook_allow_internal = true;
        s.node_lost_timeout_secs = 3600;
    })
    .await;
    let op = app.operator().await;
    let agent = crate::agents::FakeAgent::join(&app, &op, "n1", "A100-40G", "z1").await;
    let ada = app.signup("ada@example.com", "Lab").await;

    let got = ada.get(&app, "/api/v1/me/notifications").await;
    assert_eq!(got["email"], json!([]), "nothing until one chooses");
    assert_eq!(got["email_available"], true);
    assert_eq!(got["address"], "ada@example.com");
    assert!(got["events"]
        .as_array()
        .unwrap()
        .contains(&json!("quota.nearly_used")));
    let res = ada
        .send(
            &app,
            Method::PUT,
            "/api/v1/me/notifications",
            Some(json!({"email": ["task.failed", "task.exploded"]})),
        )
        .await;
    let body = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("email[1] must be one of"),
        "{body}"
    );
    let res = ada
        .send(
            &app,
            Method::PUT,
            "/api/v1/me/notifications",
            Some(json!({"email": ["task.failed", "quota.nearly_used"]})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let got = ada.get(&app, "/api/v1/me/notifications").await;
    assert_eq!(got["email"], json!(["task.failed", "quota.nearly_used"]));

    // The organization's webhook hears of the quota too.
    let mut hook = receiver().await;
    let res = ada
        .send(
            &app,
            Method::POST,
            "/api/v1/tenant/webhooks",
            Some(json!({"url": hook.url, "events": ["quota.nearly_used"]})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let secret = res.json::<Value>().await.unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned();

    // Ada caps herself at 0.1 GPU-hours this month, then runs three tasks: one completes
    // (not chosen: no email), one fails, one runs five minutes on one GPU (83% of the cap).
    let res = ada
        .send(
            &app,
            Method::PUT,
            &format!("/api/v1/tenant/members/{}/quota", ada.id()),
            Some(json!({"gpu_hours_per_month": 0.1})),
        )
        .await;
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "{}",
        res.text().await.unwrap()
    );
    let ok = submit(&app, &ada, "fine").await;
    let broken = submit(&app, &ada, "broken").await;
    let long = submit(&app, &ada, "long").await;
    app.runner().cycle(clock.now_ms()).await.unwrap();
    agent.poll(&[], 0).await;
    for id in [&ok, &broken, &long] {
        let res = agent
            .call(
                &format!("/api/v1/agent/tasks/{id}/started"),
                json!({"attempt": 1}),
            )
            .await;
        assert!(res.status().is_success());
    }
    for (id, code, reason) in [(&ok, 0, "success"), (&broken, 1, "error")] {
        let res = agent
            .call(
                &format!("/api/v1/agent/tasks/{id}/finished"),
                json!({"attempt": 1, "exit_code": code, "reason": reason}),
            )
            .await;
        assert!(res.status().is_success(), "{}", res.text().await.unwrap());
    }
    let failed = mail.next().await;
    assert_eq!(failed["to"], json!(["ada@example.com"]));
    assert_eq!(failed["from"], "noreply@autodl.example");
    assert_eq!(subject(&failed), "Task broken failed");
    assert!(failed["data"].as_str().unwrap().contains(&broken));

    clock.advance(5 * 60_000);
    agent.poll(&[(long.clone(), 1)], 0).await;
    app.runner().cycle(clock.now_ms()).await.unwrap();
    let quota = mail.next().await;
    let month = autodl_server::notify::quota::month_of(clock.now_ms());
    assert_eq!(quota["to"], json!(["ada@example.com"]));
    assert_eq!(
        subject(&quota),
        format!("80% of your GPU-hours for {month} used")
    );
    let hooked = told(&app, &mut hook, &secret, 1).await;
    assert_eq!(hooked[0]["event"], "quota.nearly_used");
    assert_eq!(hooked[0]["data"]["scope"], "user");
    assert_eq!(hooked[0]["data"]["subject"]["email"], "ada@example.com");
    assert_eq!(hooked[0]["data"]["percent"], 80);
    assert_eq!(hooked[0]["data"]["limit_gpu_hours"], 0.1);

    // Told once: another look finds nothing new; the completed task was never emailed.
    app.runner().cycle(clock.now_ms()).await.unwrap();
    assert_eq!(
        autodl_server::notify::quota::check(app.state.store.as_ref(), clock.now_ms())
            .await
            .unwrap(),
        0
    );
    mail.quiet(Duration::from_secs(3)).await;
    let sent = app
        .state
        .store
        .emails_to("ada@example.com", 10)
        .await
        .unwrap();
    assert_eq!(sent.len(), 2);
    assert!(sent
        .iter()
        .all(|e| e.sent_at.is_some() && e.next_at.is_none()));
}

async fn without_a_mail_server_nobody_can_ask_for_email(b: Backend) {
    let app = spawn_app(b).await;
    let ada = app.signup("ada@example.com", "Lab").await;
    assert_eq!(
        ada.get(&app, "/api/v1/me/notifications").await["email_available"],
        false
    );
    let res = ada
        .send(
            &app,
            Method::PUT,
            "/api/v1/me/notifications",
            Some(json!({"email": ["task.failed"]})),
        )
        .await;
    assert_error(res, StatusCode::CONFLICT, "conflict").await;
    let res = ada
        .send(
            &app,
            Method::PUT,
            "/api/v1/me/notifications",
            Some(json!({"email": []})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
}

/// Where the server sends email, a sign-up is answered the same whether the address has an
/// account or not (no account enumeration): the address is told by email, with a link to
/// finish a new account, or that it has one.
async fn sign_ups_are_finished_by_email_and_tell_nobody_who_has_an_account(b: Backend) {
    let mut mail = sink().await;
    let port = mail.port;
    let app = crate::helpers::spawn_app_with(b, |s| {
        s.smtp_url = Some(format!("smtp://127.0.0.1:{port}"));
        s.signup_confirmation = Some(false);
    })
    .await;
    let existing = app.signup("ada@example.com", "Lab").await;
    drop(existing);
    // From now on sign-ups are confirmed by email (a server restarted with it on).
    app.kill().await;
    let app = app
        .restart_with(|s| s.signup_confirmation = Some(true))
        .await;
    let sign_up = |email: &'static str| {
        let app = &app;
        async move {
            let res = app
                .post_json(
                    "/api/v1/auth/signup",
                    &json!({"email": email, "password": crate::helpers::PASSWORD, "tenant_name": "Org"}),
                )
                .await;
            let status = res.status();
            let cookies = res.headers().get_all("set-cookie").iter().count();
            let body: Value = res.json().await.unwrap();
            (status, cookies, body)
        }
    };
    let (s_old, c_old, b_old) = sign_up("ada@example.com").await;
    let (s_new, c_new, b_new) = sign_up("new@example.com").await;
    assert_eq!((s_old, c_old), (StatusCode::ACCEPTED, 0), "{b_old}");
    assert_eq!((s_new, c_new), (StatusCode::ACCEPTED, 0), "{b_new}");
    let shape = |b: &Value| {
        b["message"]
            .as_str()
            .unwrap()
            .replace("ada@example.com", "X")
            .replace("new@example.com", "X")
    };
    assert_eq!(shape(&b_old), shape(&b_new), "the same answer either way");
    assert_eq!(b_old["status"], "confirm_email");
    // Each address is told by email.
    let mut told = std::collections::HashMap::new();
    for _ in 0..2 {
        let m = mail.next().await;
        let to = m["to"][0].as_str().unwrap_or_default().to_owned();
        // Long lines travel quoted-printable.
        let data = m["data"]
            .as_str()
            .unwrap()
            .replace("=\r\n", "")
            .replace("=\n", "")
            .replace("=3D", "=");
        told.insert(to, data);
    }
    let old = told
        .get("ada@example.com")
        .expect("the existing address is told");
    assert!(old.contains("already"), "{old}");
    let new = told
        .get("new@example.com")
        .expect("the new address is told");
    let token = new
        .split("token=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("a link with its token")
        .trim_end_matches('=')
        .to_owned();
    // Nothing is made until the link is followed; then the account exists and is signed in.
    let res = app
        .post_json(
            "/api/v1/auth/login",
            &json!({"email": "new@example.com", "password": crate::helpers::PASSWORD}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = app
        .post_json("/api/v1/auth/signup/confirm", &json!({"token": token}))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["user"]["email"], "new@example.com", "{body}");
    assert_eq!(body["user"]["role"], "owner", "{body}");
    let again = app
        .post_json("/api/v1/auth/signup/confirm", &json!({"token": token}))
        .await;
    assert_error(again, StatusCode::NOT_FOUND, "not_found").await;
}
