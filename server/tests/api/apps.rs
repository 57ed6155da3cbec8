//! A task's web port opened in the browser: on an origin of its own, entered with a ticket,
//! carried through the tunnels with nothing of the platform's sign-in.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use reqwest::{redirect, Client, StatusCode};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::e2e::{start_agent, submit, wait_for};
use crate::helpers::{spawn_app_with, Backend, Session, TestApp};
use crate::tunnels::free_port;

crate::on_both_backends!(a_tasks_web_port_opens_on_its_own_origin);

pub const APP: &str = include_str!("app_server.py");

pub fn server_port(app: &TestApp) -> u16 {
    app.address.rsplit(':').next().unwrap().parse().unwrap()
}

/// Asks the platform to open the app; returns the answer (a redirect, not followed).
pub async fn open(
    app: &TestApp,
    s: &Session,
    id: &str,
    port: u16,
    path: &str,
) -> reqwest::Response {
    Client::builder()
        .redirect(redirect::Policy::none())
        .build()
        .unwrap()
        .get(app.url(&format!("/api/v1/tasks/{id}/ports/{port}/open{path}")))
        .bearer_auth(&s.token)
        .send()
        .await
        .unwrap()
}

/// A browser of the apps origin: `*.localhost` names go to this server.
pub fn browser(app: &TestApp, host: &str) -> Client {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], server_port(app)));
    Client::builder()
        .redirect(redirect::Policy::none())
        .resolve(host, addr)
        .build()
        .unwrap()
}

async fn a_tasks_web_port_opens_on_its_own_origin(backend: Backend) {
    let app = spawn_app_with(backend, |_| {}).await;
    let op = app.operator().await;
    let agent = start_agent(&app, &op, "sim-a100", "2xA100-40G").await;
    let ada = app.signup("ada@example.com", "Lab").await;
    let port = free_port();
    let id = submit(
        &app,
        &ada,
        json!({"name": "notebook", "image": "none", "kind": "session", "ports": [port],
            "env": {"APP": APP},
            "command": format!("exec python3 -c \"$APP\" {port}"),
            "resources": {"gpu": {"count": 1}}}),
    )
    .await;
    wait_for(&app, &ada, &id, &["running"], 30).await;

    // The platform answers with the app's origin and a ticket.
    let res = open(&app, &ada, &id, port, "?path=/headers").await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let to = res.headers()[LOCATION].to_str().unwrap().to_owned();
    let host = format!("{port}-{id}.apps.localhost");
    let origin = format!("http://{host}:{}", server_port(&app));
    assert!(
        to.starts_with(&format!("{origin}/.autodl/enter?ticket=")),
        "{to}"
    );
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["url"], to);

    // The apps origin trades the ticket for its own pass, once.
    let b = browser(&app, &host);
    let res = b.get(&to).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(res.headers()[LOCATION], "/headers");
    let set = res.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    assert!(
        set.starts_with("autodl_app=") && set.contains("HttpOnly"),
        "{set}"
    );
    let pass = set.split(';').next().unwrap().to_owned();
    let res = b.get(&to).send().await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::UNAUTHORIZED,
        "a ticket is good once"
    );
    assert!(res.text().await.unwrap().contains(&format!("/tasks/{id}")));

    // The app sees its own cookies and credentials, never the platform's.
    let mut seen = Value::Null;
    for _ in 0..50 {
        let res = b
            .get(format!("{origin}/headers?x=1"))
            .header(COOKIE, format!("{pass}; autodl_session=stolen; theme=dark"))
            .header("authorization", format!("Bearer {}", ada.token))
            .header("x-forwarded-for", "10.9.8.7")
            .send()
            .await
            .unwrap();
        if res.status() == StatusCode::OK {
            let cookies: Vec<String> = res
                .headers()
                .get_all(SET_COOKIE)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect();
            assert_eq!(cookies, vec!["_xsrf=abc; Path=/"], "held to its host");
            assert!(
                res.headers().get("content-security-policy").is_none(),
                "the platform's policy is not the app's"
            );
            seen = res.json().await.unwrap();
            break;
        }
        assert_eq!(res.status(), StatusCode::BAD_GATEWAY, "until it listens");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let h = &seen["headers"];
    assert_eq!(seen["path"], "/headers?x=1", "{seen}");
    assert_eq!(h["cookie"], "theme=dark", "{seen}");
    assert!(h.get("authorization").is_none(), "{seen}");
    assert!(h.get("x-forwarded-for").is_none(), "{seen}");
    assert_eq!(h["host"], format!("{host}:{}", server_port(&app)));
    assert_eq!(h["x-forwarded-proto"], "http");

    // Bodies go up, and the page comes down.
    let res = b
        .post(format!("{origin}/form"))
        .header(COOKIE, &pass)
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(res.text().await.unwrap(), "got hello");
    let res = b
        .get(format!("{origin}/"))
        .header(COOKIE, &pass)
        .send()
        .await
        .unwrap();
    assert!(res.text().await.unwrap().contains("Hello from the task"));

    // WebSockets, with the subprotocol the app chose.
    let mut req = format!("ws://127.0.0.1:{}/ws", server_port(&app))
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "host",
        format!("{host}:{}", server_port(&app)).parse().unwrap(),
    );
    req.headers_mut().insert("cookie", pass.parse().unwrap());
    req.headers_mut()
        .insert("sec-websocket-protocol", "chat".parse().unwrap());
    let (mut ws, answer) = tokio_tungstenite::connect_async(req).await.unwrap();
    assert_eq!(answer.headers()["sec-websocket-protocol"], "chat");
    ws.send(Message::text("hi")).await.unwrap();
    let echoed = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .unwrap();
    assert_eq!(echoed.unwrap().unwrap(), Message::text("echo: hi"));
    ws.send(Message::binary(vec![1u8, 2, 3])).await.unwrap();
    let echoed = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .unwrap();
    assert_eq!(
        echoed.unwrap().unwrap(),
        Message::binary(b"echo: \x01\x02\x03".to_vec())
    );
    ws.close(None).await.unwrap();

    // The apps site serves nothing of the platform's, whatever the spelling of its name (a
    // trailing dot is the same name to DNS and to browsers).
    for host in [
        format!("evil.apps.localhost.:{}", server_port(&app)),
        format!("EVIL.apps.localhost:{}", server_port(&app)),
    ] {
        for path in ["/login", "/api/v1/auth/sso/providers", "/api/v1/me"] {
            let res = Client::new()
                .get(format!("http://127.0.0.1:{}{path}", server_port(&app)))
                .header("host", &host)
                .send()
                .await
                .unwrap();
            let status = res.status();
            let body = res.text().await.unwrap();
            assert!(
                status == StatusCode::NOT_FOUND || status == StatusCode::BAD_REQUEST,
                "{host}{path}: {status} {body}"
            );
            assert!(!body.contains("Sign in"), "{host}{path}: {body}");
        }
    }

    // Refusals: no pass, another app's pass, another site's page acting with it.
    let res = b.get(format!("{origin}/")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let other_port = free_port();
    let other = format!("{other_port}-{id}.apps.localhost");
    let res = browser(&app, &other)
        .get(format!("http://{other}:{}/", server_port(&app)))
        .header(COOKIE, &pass)
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::UNAUTHORIZED,
        "a pass is for one app"
    );
    let res = b
        .post(format!("{origin}/form"))
        .header(COOKIE, &pass)
        .header("sec-fetch-site", "same-site")
        .header("sec-fetch-mode", "cors")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    // Nothing of the platform is served on the apps site.
    let res = browser(&app, "apps.localhost")
        .get(format!(
            "http://apps.localhost:{}/api/v1/me",
            server_port(&app)
        ))
        .bearer_auth(&ada.token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let res = open(&app, &ada, &id, 22, "").await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST, "an undeclared port");
    let eve = app.signup("eve@example.com", "Other").await;
    assert_eq!(
        open(&app, &eve, &id, port, "").await.status(),
        StatusCode::NOT_FOUND
    );
    let bob = app.invite_and_join(&ada, "bob@example.com", "member").await;
    assert_eq!(
        open(&app, &bob, &id, port, "").await.status(),
        StatusCode::FORBIDDEN
    );

    // Who opened it is in the timeline.
    let events = ada.get(&app, &format!("/api/v1/tasks/{id}/events")).await;
    assert!(
        events
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["message"] == format!("ada@example.com opened port {port} in the browser")),
        "{events}"
    );

    // Signing out ends what the sign-in opened.
    let res = ada
        .send(&app, reqwest::Method::POST, "/api/v1/auth/logout", None)
        .await;
    assert!(res.status().is_success());
    let res = b
        .get(format!("{origin}/"))
        .header(COOKIE, &pass)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "signed out");

    // A task that ended is not served.
    let ada = app.login("ada@example.com", crate::helpers::PASSWORD).await;
    let res = open(&app, &ada, &id, port, "").await;
    let to = res.headers()[LOCATION].to_str().unwrap().to_owned();
    let res = b.get(&to).send().await.unwrap();
    let pass = res.headers()[SET_COOKIE]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    ada.send(
        &app,
        reqwest::Method::POST,
        &format!("/api/v1/tasks/{id}/cancel"),
        None,
    )
    .await;
    wait_for(&app, &ada, &id, &["cancelled"], 30).await;
    let res = b
        .get(format!("{origin}/"))
        .header(COOKIE, &pass)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}
