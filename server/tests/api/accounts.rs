//! Sign-up, log-in, sessions, CSRF and password changes.

use autodl_server::auth::session::Claims;
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{
    assert_error, spawn_app, spawn_app_on_clock, spawn_app_with, Backend, PASSWORD,
};

crate::on_both_backends!(
    health_and_openapi,
    signup_creates_owner_and_tenant,
    signup_rejects_bad_input_and_changes_nothing,
    login_checks_password_and_is_rate_limited,
    bearer_token_and_cookie_sessions,
    tampered_and_expired_tokens_are_refused,
    logout_ends_the_session,
    csrf_is_required_for_cookie_writes,
    password_change_ends_other_sessions,
    sessions_are_renewed_before_expiry,
    pages_renew_the_session_too,
);

async fn health_and_openapi(b: Backend) {
    let app = spawn_app(b).await;
    let health: Value = Client::new()
        .get(app.url("/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    let doc: Value = Client::new()
        .get(app.url("/api/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for path in [
        "/api/v1/auth/signup",
        "/api/v1/auth/login",
        "/api/v1/api-keys",
        "/api/v1/api-keys/{id}",
        "/api/v1/me",
    ] {
        assert!(
            doc["paths"][path].is_object(),
            "{path} missing from the OpenAPI document"
        );
    }
    assert!(doc["components"]["schemas"]["SignupRequest"].is_object());
    let res = Client::new()
        .get(app.url("/api/v1/no-such-thing"))
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
}

async fn signup_creates_owner_and_tenant(b: Backend) {
    let app = spawn_app(b).await;
    let s = app.signup("Ada@Example.com", "Vision Lab").await;
    assert_eq!(s.user["email"], "ada@example.com");
    assert_eq!(s.user["role"], "owner");
    assert_eq!(s.user["tenant_name"], "Vision Lab");
    assert_eq!(s.user["platform_admin"], false);
    let me = s.get(&app, "/api/v1/me").await;
    assert_eq!(me, s.user);
    let tenant = s.get(&app, "/api/v1/tenant").await;
    assert_eq!(tenant["name"], "Vision Lab");
    assert_eq!(tenant["members"], 1);
}

async fn signup_rejects_bad_input_and_changes_nothing(b: Backend) {
    let app = spawn_app(b).await;
    app.signup("taken@example.com", "Taken Org").await;
    let cases = [
        (
            json!({"email": "not-an-email", "password": PASSWORD, "tenant_name": "X"}),
            StatusCode::BAD_REQUEST,
            "validation",
            Some("email"),
        ),
        (
            json!({"email": "", "password": PASSWORD, "tenant_name": "X"}),
            StatusCode::BAD_REQUEST,
            "validation",
            Some("email"),
        ),
        (
            json!({"email": "a@example.com", "password": "short1", "tenant_name": "X"}),
            StatusCode::BAD_REQUEST,
            "validation",
            Some("password"),
        ),
        (
            json!({"email": "a@example.com", "password": "aaaaaaaaaaaaaaa", "tenant_name": "X"}),
            StatusCode::BAD_REQUEST,
            "validation",
            Some("password"),
        ),
        (
            json!({"email": "a@example.com", "password": PASSWORD}),
            StatusCode::BAD_REQUEST,
            "validation",
            Some("tenant_name"),
        ),
        (
            json!({"email": "a@example.com", "password": PASSWORD, "tenant_name": "x".repeat(65)}),
            StatusCode::BAD_REQUEST,
            "validation",
            Some("tenant_name"),
        ),
        (
            json!({"email": "a@example.com", "password": PASSWORD, "tenant_name": "X", "admin": true}),
            StatusCode::BAD_REQUEST,
            "validation",
            Some("admin"),
        ),
        (
            json!({"password": PASSWORD, "tenant_name": "X"}),
            StatusCode::BAD_REQUEST,
            "validation",
            Some("email"),
        ),
        (
            json!({"email": "a@example.com", "password": PASSWORD, "tenant_name": "X", "invitation": "bogus"}),
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        ),
        (
            json!({"email": "TAKEN@example.com", "password": PASSWORD, "tenant_name": "Other"}),
            StatusCode::CONFLICT,
            "conflict",
            None,
        ),
        (
            json!({"email": "b@example.com", "password": PASSWORD, "tenant_name": "taken org"}),
            StatusCode::CONFLICT,
            "conflict",
            None,
        ),
    ];
    for (body, status, code, field) in cases {
        let res = app.post_json("/api/v1/auth/signup", &body).await;
        let err = assert_error(res, status, code).await;
        if let Some(f) = field {
            assert_eq!(err["error"]["field"], f, "for {body}");
        }
    }
    // Malformed JSON, wrong content type and an oversize body.
    let raw = |body: &'static str, ct: &'static str| {
        Client::new()
            .post(app.url("/api/v1/auth/signup"))
            .header("content-type", ct)
            .body(body)
            .send()
    };
    assert_error(
        raw("{\"email\": ", "application/json").await.unwrap(),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    assert_error(
        raw("email=a", "application/x-www-form-urlencoded")
            .await
            .unwrap(),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    let huge =
        json!({"email": "c@example.com", "password": PASSWORD, "tenant_name": "y".repeat(400_000)});
    assert_error(
        app.post_json("/api/v1/auth/signup", &huge).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;

    // Nothing was created by any of them, and the existing account still works.
    assert_eq!(app.state.store.list_users().await.unwrap().len(), 1);
    assert_eq!(app.state.store.list_tenants().await.unwrap().len(), 1);
    app.login("taken@example.com", PASSWORD).await;
}

async fn login_checks_password_and_is_rate_limited(b: Backend) {
    let app = spawn_app_with(b, |s| s.login_attempts_per_minute_per_account = 5).await;
    app.signup("grace@example.com", "Navy").await;
    let bad = json!({"email": "grace@example.com", "password": "Wrong-password-1"});
    let res = app.post_json("/api/v1/auth/login", &bad).await;
    assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let unknown = json!({"email": "nobody@example.com", "password": PASSWORD});
    let body = assert_error(
        app.post_json("/api/v1/auth/login", &unknown).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    assert_eq!(
        body["error"]["message"], "wrong email or password",
        "unknown and wrong answer alike"
    );
    let s = app.login("grace@example.com", PASSWORD).await;
    assert_eq!(s.user["email"], "grace@example.com");
    // Five attempts a minute for this account: two so far, three more, then refusal even
    // with the right password.
    for _ in 0..3 {
        assert_eq!(
            app.post_json("/api/v1/auth/login", &bad).await.status(),
            StatusCode::UNAUTHORIZED
        );
    }
    let good = json!({"email": "grace@example.com", "password": PASSWORD});
    let res = app.post_json("/api/v1/auth/login", &good).await;
    assert!(res.headers().contains_key("retry-after"));
    assert_error(res, StatusCode::TOO_MANY_REQUESTS, "rate_limited").await;
    // Another account is not held by this one's limit.
    app.signup("hopper@example.com", "Cobol").await;
    app.login("hopper@example.com", PASSWORD).await;
}

async fn bearer_token_and_cookie_sessions(b: Backend) {
    let app = spawn_app(b).await;
    let s = app.signup("lin@example.com", "Lin Lab").await;
    // The login token works as a Bearer token without cookies or CSRF.
    let res = Client::new()
        .post(app.url("/api/v1/api-keys"))
        .bearer_auth(&s.token)
        .json(&json!({"name": "cli"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    // No credentials at all.
    let res = Client::new()
        .get(app.url("/api/v1/me"))
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let res = Client::new()
        .get(app.url("/api/v1/me"))
        .header("authorization", "Basic abc")
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
}

async fn tampered_and_expired_tokens_are_refused(b: Backend) {
    let app = spawn_app(b).await;
    let s = app.signup("eve@example.com", "Eve Org").await;
    let mut parts: Vec<String> = s.token.split('.').map(str::to_owned).collect();
    parts[2] = parts[2].chars().rev().collect();
    let tampered = parts.join(".");
    for token in [
        tampered.as_str(),
        "not.a.jwt",
        "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.",
    ] {
        let res = Client::new()
            .get(app.url("/api/v1/me"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    }
    // A correctly signed token that has expired.
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let user_id = s.id();
    let expired = app
        .state
        .sessions
        .issue(&Claims {
            sub: user_id,
            sid: "x".into(),
            csrf: "y".into(),
            iat: now - 100,
            exp: now - 10,
        })
        .unwrap();
    let res = Client::new()
        .get(app.url("/api/v1/me"))
        .bearer_auth(expired)
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    // A token signed with another secret.
    let other = autodl_server::auth::session::SessionKeys::new(b"another-secret", 3600, false);
    let forged = other
        .issue(&Claims {
            sub: s.id(),
            sid: "x".into(),
            csrf: "y".into(),
            iat: now,
            exp: now + 3600,
        })
        .unwrap();
    let res = Client::new()
        .get(app.url("/api/v1/me"))
        .bearer_auth(forged)
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
}

async fn logout_ends_the_session(b: Backend) {
    let app = spawn_app(b).await;
    let s = app.signup("out@example.com", "Out Org").await;
    let res = s
        .send(&app, Method::POST, "/api/v1/auth/logout", None)
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    // The old token is dead even if someone kept a copy.
    let res = Client::new()
        .get(app.url("/api/v1/me"))
        .bearer_auth(&s.token)
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let res = s.send(&app, Method::GET, "/api/v1/me", None).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

async fn csrf_is_required_for_cookie_writes(b: Backend) {
    let app = spawn_app(b).await;
    let s = app.signup("csrf@example.com", "Csrf Org").await;
    let res = s
        .client
        .post(app.url("/api/v1/api-keys"))
        .json(&json!({"name": "k"}))
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    let res = s
        .client
        .post(app.url("/api/v1/api-keys"))
        .header("X-CSRF-Token", "wrong")
        .json(&json!({"name": "k"}))
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    assert!(
        s.get(&app, "/api/v1/api-keys")
            .await
            .as_array()
            .unwrap()
            .is_empty(),
        "nothing was created"
    );
    let res = s
        .send(
            &app,
            Method::POST,
            "/api/v1/api-keys",
            Some(json!({"name": "k"})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
}

async fn password_change_ends_other_sessions(b: Backend) {
    let app = spawn_app(b).await;
    let s1 = app.signup("pw@example.com", "Pw Org").await;
    let s2 = app.login("pw@example.com", PASSWORD).await;
    let change =
        |current: &str, new: &str| json!({"current_password": current, "new_password": new});
    let res = s1
        .send(
            &app,
            Method::POST,
            "/api/v1/auth/password",
            Some(change("Wrong-pass-123", "Brand-new-pass-9")),
        )
        .await;
    let e = assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    assert_eq!(e["error"]["field"], "current_password");
    let res = s1
        .send(
            &app,
            Method::POST,
            "/api/v1/auth/password",
            Some(change(PASSWORD, "weak")),
        )
        .await;
    let e = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    assert_eq!(e["error"]["field"], "new_password");
    let res = s1
        .send(
            &app,
            Method::POST,
            "/api/v1/auth/password",
            Some(change(PASSWORD, "Brand-new-pass-9")),
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    // The session that changed it lives on; the other one ended.
    s1.get(&app, "/api/v1/me").await;
    assert_eq!(
        s2.send(&app, Method::GET, "/api/v1/me", None)
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );
    let res = app
        .post_json(
            "/api/v1/auth/login",
            &json!({"email": "pw@example.com", "password": PASSWORD}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    app.login("pw@example.com", "Brand-new-pass-9").await;
}

async fn sessions_are_renewed_before_expiry(b: Backend) {
    // Session expiry is judged by the server's clock: the test moves it instead of sleeping.
    let (app, clock) = spawn_app_on_clock(b, |s| s.session_ttl_secs = 4).await;
    let s = app.signup("renew@example.com", "Renew Org").await;
    clock.advance(2300);
    let res = s.send(&app, Method::GET, "/api/v1/me", None).await;
    assert_eq!(res.status(), StatusCode::OK);
    let renewed = res
        .cookies()
        .find(|c| c.name() == "autodl_session")
        .expect("renewed session cookie");
    assert_ne!(renewed.value(), s.token);
    // Past the first token's expiry, the renewed cookie (now in the jar) still works.
    clock.advance(2200);
    assert_eq!(
        s.send(&app, Method::GET, "/api/v1/me", None).await.status(),
        StatusCode::OK
    );
    // JWT expiry has one-second granularity: move until the first token is surely past it.
    clock.advance(1200);
    let res = Client::new()
        .get(app.url("/api/v1/me"))
        .bearer_auth(&s.token)
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::UNAUTHORIZED,
        "the original token expired"
    );
}

/// A researcher reading pages without JavaScript makes no API calls of their own: the page
/// renders renew the session, and the page's own reads use the renewed token.
async fn pages_renew_the_session_too(b: Backend) {
    let (app, clock) = spawn_app_on_clock(b, |s| s.session_ttl_secs = 8).await;
    let s = app.signup("pages@example.com", "Pages Org").await;
    clock.advance(4500);
    let res = s.client.get(app.url("/account")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let renewed = res
        .cookies()
        .find(|c| c.name() == "autodl_session")
        .expect("a page render renews the session");
    assert_ne!(renewed.value(), s.token);
    assert!(res.text().await.unwrap().contains("pages@example.com"));
    // Past the first token's expiry, pages still render signed in.
    clock.advance(3700);
    let html = s
        .client
        .get(app.url("/account"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(html.contains("pages@example.com"), "still signed in");
}
