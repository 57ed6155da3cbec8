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

/// A WebSocket into the server as a program holding `token` (an API key or a session).
async fn connect_as(app: &TestApp, token: &str, path: &str) -> Ws {
    let url = app.url(path).replacen("http://", "ws://", 1);
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    tokio_tungstenite::connect_async(req).await.unwrap().0
}

/// A shell running a loop until its tunnel ends; returns how long it lasted after `cut`.
async fn shell_until_cut(
    app: &TestApp,
    token: &str,
    id: &str,
    cut: impl std::future::Future<Output = ()>,
) -> (Ended, Duration) {
    let mut ws = connect_as(app, token, &format!("/api/v1/tasks/{id}/shell")).await;
    ws.send(stdin("while true; do echo tick; sleep 0.2; done\n"))
        .await
        .unwrap();
    read_until(&mut ws, "tick", 20).await;
    cut.await;
    let at = std::time::Instant::now();
    let ended = read_to_end(&mut ws, 15).await;
    (ended, at.elapsed())
}

/// Tunnels end as live streams do when their person loses access: a revoked key, a removed
/// admin, a signed-out session; and so does an app's WebSocket opened with a pass.
#[tokio::test]
async fn open_tunnels_end_when_access_ends() {
    let app = spawn_app_with(Backend::Sqlite, |_| {}).await;
    let op = app.operator().await;
    let agent = start_agent(&app, &op, "sim-cut", "2xA100-40G").await;
    let ada = app.signup("ada@example.com", "Lab").await;
    let port = free_port();
    let id = submit(
        &app,
        &ada,
        json!({"name": "notebook", "image": "none", "kind": "session", "ports": [port],
            "env": {"APP": crate::apps::APP},
            "command": format!("exec python3 -c \"$APP\" {port}"),
            "resources": {"gpu": {"count": 1}}}),
    )
    .await;
    wait_for(&app, &ada, &id, &["running"], 30).await;
    let new_key = |s: &Session| {
        let s = s.clone();
        let app = &app;
        async move {
            let k: Value = s
                .send(
                    app,
                    reqwest::Method::POST,
                    "/api/v1/api-keys",
                    Some(json!({"name": "k"})),
                )
                .await
                .json()
                .await
                .unwrap();
            (
                k["info"]["id"].as_str().unwrap().to_owned(),
                k["key"].as_str().unwrap().to_owned(),
            )
        }
    };
    let within = Duration::from_secs(6);

    // A revoked key.
    let (key_id, key) = new_key(&ada).await;
    let (ended, took) = shell_until_cut(&app, &key, &id, async {
        let res = ada
            .send(
                &app,
                reqwest::Method::DELETE,
                &format!("/api/v1/api-keys/{key_id}"),
                None,
            )
            .await;
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
    })
    .await;
    assert!(
        took < within,
        "the shell lasted {took:?} after its key was revoked"
    );
    assert!(
        ended
            .error
            .as_deref()
            .is_some_and(|e| e.contains("revoked")),
        "{ended:?}"
    );

    // An admin removed from the organization, in a colleague's task.
    let admin = app.invite_and_join(&ada, "root@example.com", "admin").await;
    let (ended, took) = shell_until_cut(&app, &admin.token, &id, async {
        let res = ada
            .send(
                &app,
                reqwest::Method::DELETE,
                &format!("/api/v1/tenant/members/{}", admin.id()),
                None,
            )
            .await;
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
    })
    .await;
    assert!(
        took < within,
        "the shell lasted {took:?} after its admin was removed"
    );
    assert!(ended.error.is_some(), "{ended:?}");

    // A session signed out.
    let again = app.login("ada@example.com", crate::helpers::PASSWORD).await;
    let (ended, took) = shell_until_cut(&app, &again.token, &id, async {
        let res = again
            .send(&app, reqwest::Method::POST, "/api/v1/auth/logout", None)
            .await;
        assert!(res.status().is_success(), "{}", res.status());
    })
    .await;
    assert!(took < within, "the shell lasted {took:?} after sign-out");
    assert!(ended.error.is_some(), "{ended:?}");

    // An app's WebSocket, through a pass made with a key that is then revoked.
    let (key_id, key) = new_key(&ada).await;
    let keyed = Session {
        token: key.clone(),
        ..ada.clone()
    };
    let res = crate::apps::open(&app, &keyed, &id, port, "").await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let to = res.headers()["location"].to_str().unwrap().to_owned();
    let host = format!("{port}-{id}.apps.localhost");
    let server_port = crate::apps::server_port(&app);
    let res = crate::apps::browser(&app, &host)
        .get(&to)
        .send()
        .await
        .unwrap();
    let pass = res.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let mut req = format!("ws://127.0.0.1:{server_port}/ws")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("host", format!("{host}:{server_port}").parse().unwrap());
    req.headers_mut().insert("cookie", pass.parse().unwrap());
    let mut ws = None;
    for _ in 0..50 {
        if let Ok((w, _)) = tokio_tungstenite::connect_async(req.clone()).await {
            ws = Some(w);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut ws = ws.expect("the app's WebSocket opens");
    ws.send(Message::text("hi")).await.unwrap();
    let echoed = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .unwrap();
    assert_eq!(echoed.unwrap().unwrap(), Message::text("echo: hi"));
    let res = ada
        .send(
            &app,
            reqwest::Method::DELETE,
            &format!("/api/v1/api-keys/{key_id}"),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let at = std::time::Instant::now();
    let closed = tokio::time::timeout(within, async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the app's WebSocket outlived its key by {:?}",
        at.elapsed()
    );
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

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

/// What `files` in the task say, read twice half a second apart (after half a second): a
/// background loop that writes the time into them changes them in between.
/// A shell loop writing the time into `$HOME/{file}` ten times a second, each time aside and
/// renamed into place, so a read never catches the file just truncated.
fn heartbeat(file: &str) -> String {
    format!(
        "while true; do date +%s%N > \"$HOME/{file}.new\"; mv \"$HOME/{file}.new\" \"$HOME/{file}\"; sleep 0.1; done"
    )
}

async fn two_reads(app: &TestApp, s: &Session, id: &str, files: &str) -> (String, String) {
    let path = exec_path(id, &["sh", "-c", &format!("cat {files}")]);
    let mut reads = Vec::new();
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut ws = connect(app, s, &path).await.unwrap();
        reads.push(read_to_end(&mut ws, 20).await.stdout);
    }
    let second = reads.pop().unwrap();
    (reads.pop().unwrap(), second)
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
    ws.send(stdin("stty size; echo term=$TERM; echo $((6*7))\n"))
        .await
        .unwrap();
    let seen = read_until(&mut ws, "42", 20).await;
    assert!(seen.contains("30 100"), "the terminal's size: {seen}");
    assert!(
        seen.contains("term=xterm-256color"),
        "a terminal says what it is: {seen}"
    );
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
    // What the shell started with nohup outlives it (until the task ends), and the shell's
    // exit still ends the tunnel at once.
    ws.send(stdin(&format!(
        "nohup sh -c '{}' >/dev/null 2>&1 &\n",
        heartbeat("alive")
    )))
    .await
    .unwrap();
    ws.send(stdin("exit 0\n")).await.unwrap();
    let at = std::time::Instant::now();
    let ended = read_to_end(&mut ws, 20).await;
    assert_eq!(ended.exit, Some(0), "{ended:?}");
    assert!(
        at.elapsed() < Duration::from_secs(5),
        "the shell's exit ended the tunnel only after {:?}",
        at.elapsed()
    );
    let (first, second) = two_reads(&app, &ada, &id, "\"$HOME/alive\"").await;
    assert!(
        !first.trim().is_empty() && first != second,
        "the shell's background process stopped with it: {first:?} then {second:?}"
    );

    // So does what a command on pipes starts in the background (`autodl exec t -- sh -c
    // 'nohup server &'`, as over ssh): the exec ends with its command.
    let beat = |file: &str| format!("nohup sh -c '{}' >/dev/null 2>&1 &", heartbeat(file));
    let at = std::time::Instant::now();
    let mut ws = connect(&app, &ada, &exec_path(&id, &["sh", "-c", &beat("served")]))
        .await
        .unwrap();
    let ended = read_to_end(&mut ws, 20).await;
    assert_eq!(ended.exit, Some(0), "{ended:?}");
    assert!(
        at.elapsed() < Duration::from_secs(5),
        "the exec ended only after {:?}",
        at.elapsed()
    );
    let (first, second) = two_reads(&app, &ada, &id, "\"$HOME/served\"").await;
    assert!(
        !first.trim().is_empty() && first != second,
        "the exec's background process stopped with it: {first:?} then {second:?}"
    );
    // A command left before it ends (the person pressed Ctrl-C) ends, with what it started.
    let script = format!("{}\n{}", beat("bg"), heartbeat("fg"));
    let ws = connect(&app, &ada, &exec_path(&id, &["sh", "-c", &script]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    drop(ws);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (first, second) = two_reads(&app, &ada, &id, "\"$HOME/fg\" \"$HOME/bg\"").await;
    assert!(
        first.lines().count() == 2 && first == second,
        "a command left before its end still runs: {first:?} then {second:?}"
    );

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
    // task has a network of its own, so the tunnel reaches nothing of the host's.
    if running_as_root() {
        foreign.set_nonblocking(true).unwrap();
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
                .is_some_and(|e| e.contains("cannot be reached")),
            "{ended:?}"
        );
        assert!(
            foreign.accept().is_err(),
            "the tunnel reached the host's service"
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
