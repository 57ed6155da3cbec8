//! Shells, commands and ports through the server into running tasks, with a real agent.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::e2e::{start_agent, submit, wait_for};
use crate::helpers::{spawn_app_with, Backend, Session, TestApp};

crate::on_both_backends!(shells_commands_and_ports_reach_a_running_task);

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub async fn connect(app: &TestApp, s: &Session, path: &str) -> Result<Ws, u16> {
    let url = app.url(path).replacen("http://", "ws://", 1);
    let mut req = url.into_client_request().unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", s.token).parse().unwrap(),
    );
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("{e}"),
    }
}

/// What came back until the end: stdout, stderr, the exit code or the error said.
#[derive(Debug, Default)]
pub struct Ended {
    pub stdout: String,
    pub stderr: String,
    pub exit: Option<i64>,
    pub error: Option<String>,
}

pub async fn read_to_end(ws: &mut Ws, secs: u64) -> Ended {
    let mut out = Ended::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, ws.next()).await {
        match msg.unwrap() {
            Message::Binary(b) if b.first() == Some(&1) => {
                out.stdout.push_str(&String::from_utf8_lossy(&b[1..]))
            }
            Message::Binary(b) if b.first() == Some(&2) => {
                out.stderr.push_str(&String::from_utf8_lossy(&b[1..]))
            }
            Message::Text(t) => {
                let c: Value = serde_json::from_str(t.as_str()).unwrap();
                match c["type"].as_str() {
                    Some("exit") => out.exit = c["code"].as_i64(),
                    Some("error") => out.error = c["message"].as_str().map(str::to_owned),
                    _ => {}
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    out
}

pub fn stdin(text: &str) -> Message {
    let mut b = vec![0u8];
    b.extend_from_slice(text.as_bytes());
    Message::binary(b)
}

/// Reads a shell's terminal until `want` shows up.
pub async fn read_until(ws: &mut Ws, want: &str, secs: u64) -> String {
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !seen.contains(want) {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => seen.push_str(&String::from_utf8_lossy(&b[1..])),
            Ok(Some(Ok(Message::Text(t)))) => seen.push_str(t.as_str()),
            Ok(Some(Ok(_))) => {}
            other => panic!("no {want:?} in the terminal ({other:?}): {seen}"),
        }
    }
    seen
}

pub fn exec_path(id: &str, argv: &[&str]) -> String {
    let command = serde_json::to_string(argv).unwrap();
    let q: String = url_escape(&command);
    format!("/api/v1/tasks/{id}/exec?command={q}")
}

fn url_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0")
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn shells_commands_and_ports_reach_a_running_task(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let agent = start_agent(&app, &op, "sim-a100", "2xA100-40G").await;
    let ada = app.signup("ada@example.com", "Lab").await;
    let port = free_port();
    // A port something else on the node listens on (here: this test, as root in CI).
    let foreign = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let foreign_port = foreign.local_addr().unwrap().port();
    let id = submit(
        &app,
        &ada,
        json!({"name": "notebook", "image": "none", "kind": "session", "ports": [port, foreign_port],
            "command": format!("echo started; exec python3 -m http.server {port} --bind 127.0.0.1"),
            "resources": {"gpu": {"count": 1}}}),
    )
    .await;
    let t = wait_for(&app, &ada, &id, &["running"], 30).await;
    assert_eq!(t["spec"]["kind"], "session", "{t}");
    assert_eq!(
        t["spec"]["preemptible"], false,
        "a session is not preempted unless allowed"
    );

    // One command: stdout and stderr apart, and its exit code.
    let mut ws = connect(
        &app,
        &ada,
        &exec_path(
            &id,
            &["sh", "-c", "echo out $AUTODL_TASK_ID; echo err >&2; exit 3"],
        ),
    )
    .await
    .unwrap();
    let ended = read_to_end(&mut ws, 20).await;
    assert_eq!(ended.stdout, format!("out {id}\n"), "{ended:?}");
    assert_eq!(ended.stderr, "err\n", "{ended:?}");
    assert_eq!(ended.exit, Some(3), "{ended:?}");

    // Input reaches the command and its end of input ends it.
    let mut ws = connect(&app, &ada, &exec_path(&id, &["cat"]))
        .await
        .unwrap();
    ws.send(stdin("through the server\n")).await.unwrap();
    ws.send(Message::text(r#"{"type":"eof"}"#)).await.unwrap();
    let ended = read_to_end(&mut ws, 20).await;
    assert_eq!(ended.stdout, "through the server\n", "{ended:?}");
    assert_eq!(ended.exit, Some(0));

    // A shell on a terminal: it computes, Ctrl-C interrupts what runs, resize is taken.
    let mut ws = connect(
        &app,
        &ada,
        &format!("/api/v1/tasks/{id}/shell?cols=100&rows=30"),
    )
    .await
    .unwrap();
    ws.send(stdin("stty size; echo $((6*7))\n")).await.unwrap();
    let seen = read_until(&mut ws, "42", 20).await;
    assert!(seen.contains("30 100"), "the terminal's size: {seen}");
    ws.send(stdin("sleep 60; echo slept\n")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    ws.send(stdin("\u{3}")).await.unwrap();
    ws.send(Message::text(r#"{"type":"resize","cols":120,"rows":40}"#))
        .await
        .unwrap();
    // The new size reaches the terminal at once, but a shell just interrupted may still be
    // settling: asked again until it says so (a resize never taken fails after 10 tries).
    let mut seen = String::new();
    for n in 0.. {
        ws.send(stdin(&format!("stty size; echo back{n}\n")))
            .await
            .unwrap();
        seen.push_str(&read_until(&mut ws, &format!("\nback{n}"), 10).await);
        if seen.contains("40 120") || n == 9 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(seen.contains("40 120"), "the resize was not taken: {seen}");
    assert!(
        !seen.contains("\nslept"),
        "Ctrl-C did not stop the sleep: {seen}"
    );
    ws.send(stdin("exit 0\n")).await.unwrap();
    let ended = read_to_end(&mut ws, 20).await;
    assert_eq!(ended.exit, Some(0), "{ended:?}");

    // A declared port: an HTTP request through the tunnel gets the task's page.
    let mut page = String::new();
    for _ in 0..50 {
        let mut ws = connect(&app, &ada, &format!("/api/v1/tasks/{id}/ports/{port}"))
            .await
            .unwrap();
        ws.send(Message::binary(
            b"GET / HTTP/1.0\r\nHost: x\r\n\r\n".to_vec(),
        ))
        .await
        .unwrap();
        page.clear();
        while let Ok(Some(Ok(m))) = tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            match m {
                Message::Binary(b) => page.push_str(&String::from_utf8_lossy(&b)),
                Message::Text(t) => page.push_str(t.as_str()),
                Message::Close(_) => break,
                _ => {}
            }
        }
        if page.starts_with("HTTP/1.0 200") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(page.starts_with("HTTP/1.0 200"), "{page}");
    assert!(page.contains("Directory listing"), "{page}");

    // A declared port that is not the task's own: on an isolated node (root, as in CI) the
    // agent refuses to carry anyone to it.
    if running_as_root() {
        let mut ws = connect(
            &app,
            &ada,
            &format!("/api/v1/tasks/{id}/ports/{foreign_port}"),
        )
        .await
        .unwrap();
        let ended = read_to_end(&mut ws, 20).await;
        assert!(
            ended
                .error
                .as_deref()
                .is_some_and(|e| e.contains("no process of the task listens")),
            "{ended:?}"
        );
    }
    drop(foreign);

    // Refusals: an undeclared port, bad commands, people without the right.
    assert_eq!(
        connect(&app, &ada, &format!("/api/v1/tasks/{id}/ports/22"))
            .await
            .err(),
        Some(400)
    );
    assert_eq!(
        connect(&app, &ada, &format!("/api/v1/tasks/{id}/exec?command=ls"))
            .await
            .err(),
        Some(400)
    );
    let res = ada
        .send(
            &app,
            reqwest::Method::GET,
            &format!("/api/v1/tasks/{id}/shell"),
            None,
        )
        .await;
    assert_eq!(
        res.status(),
        StatusCode::BAD_REQUEST,
        "a plain GET is no WebSocket"
    );
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"]["field"], "upgrade");
    let eve = app.signup("eve@example.com", "Other").await;
    for path in [
        format!("/api/v1/tasks/{id}/shell"),
        exec_path(&id, &["id"]),
        format!("/api/v1/tasks/{id}/ports/{port}"),
    ] {
        assert_eq!(connect(&app, &eve, &path).await.err(), Some(404), "{path}");
    }
    let colleague = app.invite_and_join(&ada, "bob@example.com", "member").await;
    assert_eq!(
        connect(&app, &colleague, &exec_path(&id, &["id"]))
            .await
            .err(),
        Some(403),
        "a member may not reach into another member's task"
    );
    for path in [
        format!("/api/v1/tasks/{id}/shell"),
        format!("/api/v1/tasks/{id}/ports/{port}"),
    ] {
        assert_eq!(
            connect(&app, &colleague, &path).await.err(),
            Some(403),
            "{path}"
        );
    }

    // A batch task is reached too, by an admin of its organization as by its owner.
    let batch = submit(
        &app,
        &ada,
        json!({"name": "train", "image": "none", "command": "sleep 120",
            "resources": {"gpu": {"count": 1}}}),
    )
    .await;
    wait_for(&app, &ada, &batch, &["running"], 30).await;
    let admin = app
        .invite_and_join(&ada, "carol@example.com", "admin")
        .await;
    let mut ws = connect(
        &app,
        &admin,
        &exec_path(&batch, &["sh", "-c", "echo batch $AUTODL_TASK_ID"]),
    )
    .await
    .unwrap();
    let ended = read_to_end(&mut ws, 20).await;
    assert_eq!(ended.stdout, format!("batch {batch}\n"), "{ended:?}");
    assert_eq!(ended.exit, Some(0), "{ended:?}");
    let events = ada
        .get(&app, &format!("/api/v1/tasks/{batch}/events"))
        .await;
    assert!(
        events.as_array().unwrap().iter().any(|e| e["message"]
            .as_str()
            .is_some_and(|m| m.contains("carol@example.com ran: sh -c"))),
        "{events}"
    );

    // Who reached in is in the task's timeline.
    let events = ada.get(&app, &format!("/api/v1/tasks/{id}/events")).await;
    let said: Vec<String> = events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| format!("{} {}", e["kind"], e["message"]))
        .collect();
    // Nothing of the refused people's reached the task.
    assert!(
        !said
            .iter()
            .any(|e| e.contains("eve@example.com") || e.contains("bob@example.com")),
        "{said:?}"
    );
    for want in [
        "ada@example.com ran: sh -c",
        "ada@example.com opened a shell",
        "opened port",
    ] {
        assert!(said.iter().any(|e| e.contains(want)), "{want}: {said:?}");
    }

    // A finished task cannot be reached.
    ada.send(
        &app,
        reqwest::Method::POST,
        &format!("/api/v1/tasks/{id}/cancel"),
        None,
    )
    .await;
    wait_for(&app, &ada, &id, &["cancelled"], 30).await;
    assert_eq!(
        connect(&app, &ada, &exec_path(&id, &["id"])).await.err(),
        Some(409)
    );
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}
