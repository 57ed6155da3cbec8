//! API keys: shown once, stored as a hash, listed, used, revoked.

use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{assert_error, spawn_app, Backend};

crate::on_both_backends!(
    key_lifecycle,
    key_input_is_validated,
    keys_of_others_are_out_of_reach
);

async fn key_lifecycle(b: Backend) {
    let app = spawn_app(b).await;
    let s = app.signup("keys@example.com", "Keys Org").await;
    let res = s
        .send(
            &app,
            Method::POST,
            "/api/v1/api-keys",
            Some(json!({"name": "laptop", "expires_in_days": 30})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let created: Value = res.json().await.unwrap();
    let key = created["key"].as_str().unwrap().to_owned();
    assert!(key.starts_with("adl_") && key.len() > 40, "{key}");
    assert!(key.starts_with(created["info"]["prefix"].as_str().unwrap()));
    assert!(created["info"]["expires_at"].is_string());

    // Listed without the secret; the store holds only a hash.
    let list = s.get(&app, "/api/v1/api-keys").await;
    let list_text = list.to_string();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["name"], "laptop");
    assert!(list[0]["last_used_at"].is_null());
    assert!(!list_text.contains(&key));
    let stored = app.state.store.list_api_keys(&s.id()).await.unwrap();
    assert_ne!(stored[0].key_hash, key);
    assert!(!stored[0].key_hash.contains(&key[4..]));

    // The key acts as its user in their tenant, with no CSRF token needed.
    let me: Value = Client::new()
        .get(app.url("/api/v1/me"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(me["email"], "keys@example.com");
    let res = Client::new()
        .post(app.url("/api/v1/api-keys"))
        .bearer_auth(&key)
        .json(&json!({"name": "from-key"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let list = s.get(&app, "/api/v1/api-keys").await;
    let laptop = list
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "laptop")
        .unwrap();
    assert!(laptop["last_used_at"].is_string(), "use is recorded");

    // Revoked: refused with a clear message, and gone from the list.
    let id = created["info"]["id"].as_str().unwrap();
    let res = s
        .send(
            &app,
            Method::DELETE,
            &format!("/api/v1/api-keys/{id}"),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let res = Client::new()
        .get(app.url("/api/v1/me"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let e = assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert!(e["error"]["message"].as_str().unwrap().contains("revoked"));
    assert_eq!(
        s.get(&app, "/api/v1/api-keys")
            .await
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let res = s
        .send(
            &app,
            Method::DELETE,
            &format!("/api/v1/api-keys/{id}"),
            None,
        )
        .await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found").await;

    // Unknown keys.
    for bad in [
        "adl_0000000000000000000000000000000000000000000000000",
        "adl_",
    ] {
        let res = Client::new()
            .get(app.url("/api/v1/me"))
            .bearer_auth(bad)
            .send()
            .await
            .unwrap();
        assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    }
}

async fn key_input_is_validated(b: Backend) {
    let app = spawn_app(b).await;
    let s = app.signup("kv@example.com", "Kv Org").await;
    for body in [
        json!({"name": ""}),
        json!({"name": "  "}),
        json!({"name": "x".repeat(65)}),
        json!({"name": "k", "expires_in_days": 0}),
        json!({"name": "k", "expires_in_days": 99999}),
    ] {
        let res = s
            .send(&app, Method::POST, "/api/v1/api-keys", Some(body))
            .await;
        assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    }
    // Shapes the document refuses are named by the field at fault.
    for (body, field) in [
        (json!({}), "name"),
        (json!({"name": 5}), "name"),
        (
            json!({"name": "k", "expires_in_days": -1}),
            "expires_in_days",
        ),
        (json!({"name": "k", "scope": "all"}), "scope"),
    ] {
        let res = s
            .send(&app, Method::POST, "/api/v1/api-keys", Some(body.clone()))
            .await;
        let e = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
        assert_eq!(e["error"]["field"], field, "for {body}");
    }
    assert!(s
        .get(&app, "/api/v1/api-keys")
        .await
        .as_array()
        .unwrap()
        .is_empty());
}

async fn keys_of_others_are_out_of_reach(b: Backend) {
    let app = spawn_app(b).await;
    let a = app.signup("a@example.com", "Tenant A").await;
    let bob = app.signup("b@example.com", "Tenant B").await;
    let created: Value = bob
        .send(
            &app,
            Method::POST,
            "/api/v1/api-keys",
            Some(json!({"name": "b-key"})),
        )
        .await
        .json()
        .await
        .unwrap();
    let id = created["info"]["id"].as_str().unwrap();
    let res = a
        .send(
            &app,
            Method::DELETE,
            &format!("/api/v1/api-keys/{id}"),
            None,
        )
        .await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
    assert!(a
        .get(&app, "/api/v1/api-keys")
        .await
        .as_array()
        .unwrap()
        .is_empty());
    // Bob's key still works.
    let res = Client::new()
        .get(app.url("/api/v1/me"))
        .bearer_auth(created["key"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}
