//! Roles, invitations, quotas, platform administration and tenant isolation.

use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{assert_error, spawn_app, Backend, PASSWORD};

crate::on_both_backends!(
    invitations_join_a_tenant_with_a_role,
    members_cannot_manage,
    roles_keep_an_owner,
    removing_a_member_ends_their_access,
    quotas_nest_within_the_tenant,
    platform_admins_manage_tenants_and_users,
    tenants_are_isolated,
);

async fn invitations_join_a_tenant_with_a_role(b: Backend) {
    let app = spawn_app(b).await;
    let owner = app.signup("owner@example.com", "Lab").await;
    let res = owner
        .send(
            &app,
            Method::POST,
            "/api/v1/tenant/invitations",
            Some(json!({"email": "New@Example.com", "role": "admin"})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let inv: Value = res.json().await.unwrap();
    let token = inv["token"].as_str().unwrap().to_owned();
    // A link that works wherever it is pasted: the server's public address, then the path.
    let link = inv["link"].as_str().unwrap();
    assert!(link.starts_with("http"), "{link}");
    assert!(
        link.ends_with(&format!("/signup?invitation={token}")),
        "{link}"
    );
    // The same address is not invited twice while a link is open.
    let again = owner
        .send(
            &app,
            Method::POST,
            "/api/v1/tenant/invitations",
            Some(json!({"email": "new@example.com", "role": "member"})),
        )
        .await;
    assert_eq!(again.status(), StatusCode::CONFLICT);
    // Listed without the token.
    let list = owner.get(&app, "/api/v1/tenant/invitations").await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert!(list[0].get("token").is_none());

    let preview: Value = Client::new()
        .get(app.url(&format!("/api/v1/invitations/{token}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(preview["tenant_name"], "Lab");
    assert_eq!(preview["email"], "new@example.com");
    assert_error(
        Client::new()
            .get(app.url("/api/v1/invitations/nope"))
            .send()
            .await
            .unwrap(),
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;

    // Only the invited address can use it.
    let wrong = json!({"email": "other@example.com", "password": PASSWORD, "invitation": token});
    let e = assert_error(
        app.post_json("/api/v1/auth/signup", &wrong).await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    assert_eq!(e["error"]["field"], "email");

    let join = json!({"email": "new@example.com", "password": PASSWORD, "invitation": token});
    let res = app.post_json("/api/v1/auth/signup", &join).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["user"]["tenant_name"], "Lab");
    assert_eq!(body["user"]["role"], "admin");
    assert_eq!(
        owner
            .get(&app, "/api/v1/tenant/members")
            .await
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // Used once only.
    let again = json!({"email": "new2@example.com", "password": PASSWORD, "invitation": token});
    assert_error(
        app.post_json("/api/v1/auth/signup", &again).await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    assert_eq!(
        owner.get(&app, "/api/v1/tenant/invitations").await[0]["accepted"],
        true
    );

    // Revoked invitations cannot be used.
    let inv2: Value = owner
        .send(
            &app,
            Method::POST,
            "/api/v1/tenant/invitations",
            Some(json!({"email": "late@example.com"})),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(inv2["role"], "member");
    let res = owner
        .send(
            &app,
            Method::DELETE,
            &format!(
                "/api/v1/tenant/invitations/{}",
                inv2["id"].as_str().unwrap()
            ),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let late =
        json!({"email": "late@example.com", "password": PASSWORD, "invitation": inv2["token"]});
    assert_error(
        app.post_json("/api/v1/auth/signup", &late).await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;

    // Bad invitation input.
    let res = owner
        .send(
            &app,
            Method::POST,
            "/api/v1/tenant/invitations",
            Some(json!({"email": "nope"})),
        )
        .await;
    assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    let res = owner
        .send(
            &app,
            Method::POST,
            "/api/v1/tenant/invitations",
            Some(json!({"email": "x@example.com", "role": "god"})),
        )
        .await;
    let e = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    assert_eq!(e["error"]["field"], "role");
    let res = owner
        .send(
            &app,
            Method::POST,
            "/api/v1/tenant/invitations",
            Some(json!({"email": "owner@example.com"})),
        )
        .await;
    assert_error(res, StatusCode::CONFLICT, "conflict").await;
}

async fn members_cannot_manage(b: Backend) {
    let app = spawn_app(b).await;
    let owner = app.signup("o@example.com", "Org").await;
    let member = app.invite_and_join(&owner, "m@example.com", "member").await;
    let oid = owner.id();
    let calls = [
        (
            Method::POST,
            "/api/v1/tenant/invitations".to_string(),
            Some(json!({"email": "z@example.com"})),
        ),
        (Method::GET, "/api/v1/tenant/invitations".to_string(), None),
        (
            Method::PATCH,
            format!("/api/v1/tenant/members/{oid}"),
            Some(json!({"role": "member"})),
        ),
        (
            Method::DELETE,
            format!("/api/v1/tenant/members/{oid}"),
            None,
        ),
        (
            Method::PUT,
            format!("/api/v1/tenant/members/{}/quota", member.id()),
            Some(json!({"max_gpus": 100})),
        ),
        (
            Method::GET,
            format!("/api/v1/tenant/members/{oid}/quota"),
            None,
        ),
        (Method::GET, "/api/v1/admin/tenants".to_string(), None),
        (Method::GET, "/api/v1/admin/users".to_string(), None),
        (
            Method::PATCH,
            format!("/api/v1/admin/users/{oid}"),
            Some(json!({"disabled": true})),
        ),
        (
            Method::PUT,
            format!(
                "/api/v1/admin/tenants/{}/quota",
                owner.user["tenant_id"].as_str().unwrap()
            ),
            Some(json!({"max_gpus": 1})),
        ),
    ];
    for (method, path, body) in calls {
        let res = member.send(&app, method.clone(), &path, body).await;
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{method} {path}");
        assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    }
    // Members can read their organization, its members and their own quota.
    member.get(&app, "/api/v1/tenant").await;
    member.get(&app, "/api/v1/tenant/members").await;
    member.get(&app, "/api/v1/tenant/quota").await;
    member
        .get(
            &app,
            &format!("/api/v1/tenant/members/{}/quota", member.id()),
        )
        .await;
    // Nothing changed.
    let members = owner.get(&app, "/api/v1/tenant/members").await;
    assert!(members
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["disabled"] == false));
    assert_eq!(members[0]["role"], "owner");
    assert!(owner
        .get(&app, "/api/v1/tenant/invitations")
        .await
        .as_array()
        .unwrap()
        .iter()
        .all(|i| i["email"] != "z@example.com"));
}

async fn roles_keep_an_owner(b: Backend) {
    let app = spawn_app(b).await;
    let owner = app.signup("o@example.com", "Org").await;
    let admin = app.invite_and_join(&owner, "a@example.com", "admin").await;
    let member = app.invite_and_join(&owner, "m@example.com", "member").await;
    // Admins manage members but not owners.
    let res = admin
        .send(
            &app,
            Method::PATCH,
            &format!("/api/v1/tenant/members/{}", member.id()),
            Some(json!({"role": "admin"})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = admin
        .send(
            &app,
            Method::PATCH,
            &format!("/api/v1/tenant/members/{}", member.id()),
            Some(json!({"role": "owner"})),
        )
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    let res = admin
        .send(
            &app,
            Method::PATCH,
            &format!("/api/v1/tenant/members/{}", owner.id()),
            Some(json!({"role": "member"})),
        )
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    let res = admin
        .send(
            &app,
            Method::POST,
            "/api/v1/tenant/invitations",
            Some(json!({"email": "x@example.com", "role": "owner"})),
        )
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    // The last owner cannot step down.
    let res = owner
        .send(
            &app,
            Method::PATCH,
            &format!("/api/v1/tenant/members/{}", owner.id()),
            Some(json!({"role": "admin"})),
        )
        .await;
    assert_error(res, StatusCode::CONFLICT, "conflict").await;
    // With a second owner they can.
    let res = owner
        .send(
            &app,
            Method::PATCH,
            &format!("/api/v1/tenant/members/{}", admin.id()),
            Some(json!({"role": "owner"})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = owner
        .send(
            &app,
            Method::PATCH,
            &format!("/api/v1/tenant/members/{}", owner.id()),
            Some(json!({"role": "member"})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let me = owner.get(&app, "/api/v1/me").await;
    assert_eq!(me["role"], "member");
    let res = owner
        .send(
            &app,
            Method::PATCH,
            &format!("/api/v1/tenant/members/{}", owner.id()),
            Some(json!({"role": "nobody"})),
        )
        .await;
    assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
}

async fn removing_a_member_ends_their_access(b: Backend) {
    let app = spawn_app(b).await;
    let owner = app.signup("o@example.com", "Org").await;
    let member = app.invite_and_join(&owner, "m@example.com", "member").await;
    let key: Value = member
        .send(
            &app,
            Method::POST,
            "/api/v1/api-keys",
            Some(json!({"name": "k"})),
        )
        .await
        .json()
        .await
        .unwrap();
    let res = owner
        .send(
            &app,
            Method::DELETE,
            &format!("/api/v1/tenant/members/{}", owner.id()),
            None,
        )
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    let res = owner
        .send(
            &app,
            Method::DELETE,
            &format!("/api/v1/tenant/members/{}", member.id()),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        member
            .send(&app, Method::GET, "/api/v1/me", None)
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );
    let res = Client::new()
        .get(app.url("/api/v1/me"))
        .bearer_auth(key["key"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = app
        .post_json(
            "/api/v1/auth/login",
            &json!({"email": "m@example.com", "password": PASSWORD}),
        )
        .await;
    assert_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let members = owner.get(&app, "/api/v1/tenant/members").await;
    assert_eq!(
        members
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["disabled"] == true)
            .count(),
        1
    );
}

async fn quotas_nest_within_the_tenant(b: Backend) {
    let app = spawn_app(b).await;
    let owner = app.signup("o@example.com", "Org").await;
    let member = app.invite_and_join(&owner, "m@example.com", "member").await;
    let tenant_id = owner.user["tenant_id"].as_str().unwrap().to_owned();
    // Unlimited by default.
    assert_eq!(
        owner.get(&app, "/api/v1/tenant/quota").await,
        json!({"max_gpus": null, "gpu_hours_per_month": null, "max_queued_tasks": null, "allowed_gpu_types": null})
    );
    // A platform admin caps the tenant.
    let op = app.signup("op@example.com", "Operators").await;
    app.make_platform_admin(&op.id()).await;
    let cap = json!({"max_gpus": 16, "gpu_hours_per_month": 1000.0, "max_queued_tasks": 50, "allowed_gpu_types": ["A100", "A40"]});
    let res = op
        .send(
            &app,
            Method::PUT,
            &format!("/api/v1/admin/tenants/{tenant_id}/quota"),
            Some(cap.clone()),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(member.get(&app, "/api/v1/tenant/quota").await, cap);
    // The owner narrows a member's caps within the tenant's.
    let path = format!("/api/v1/tenant/members/{}/quota", member.id());
    let ok = json!({"max_gpus": 4, "gpu_hours_per_month": 100.0, "max_queued_tasks": 10, "allowed_gpu_types": ["A100-40G"]});
    let res = owner.send(&app, Method::PUT, &path, Some(ok.clone())).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(member.get(&app, &path).await, ok);
    // Well formed but beyond the organization's caps: refused, naming the cap.
    for (bad, field) in [
        (json!({"max_gpus": 17}), "max_gpus"),
        (
            json!({"gpu_hours_per_month": 5000.0}),
            "gpu_hours_per_month",
        ),
        (json!({"max_queued_tasks": 51}), "max_queued_tasks"),
        (json!({"allowed_gpu_types": ["H100"]}), "allowed_gpu_types"),
    ] {
        let res = owner.send(&app, Method::PUT, &path, Some(bad)).await;
        let e = assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
        assert_eq!(e["error"]["field"], field);
    }
    for (bad, field) in [
        (json!({"gpu_hours_per_month": -1.0}), "gpu_hours_per_month"),
        (json!({"allowed_gpu_types": [""]}), "allowed_gpu_types"),
        (json!({"max_gpus": -1}), "max_gpus"),
        (json!({"max_gpus": "four"}), "max_gpus"),
        (json!({"gpus": 1}), "gpus"),
    ] {
        let res = owner.send(&app, Method::PUT, &path, Some(bad)).await;
        let e = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
        assert_eq!(e["error"]["field"], field);
    }
    assert_eq!(
        member.get(&app, &path).await,
        ok,
        "rejected updates changed nothing"
    );
    let res = op
        .send(
            &app,
            Method::PUT,
            "/api/v1/admin/tenants/no-such-tenant/quota",
            Some(cap),
        )
        .await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
}

async fn platform_admins_manage_tenants_and_users(b: Backend) {
    let app = spawn_app(b).await;
    let op = app.signup("op@example.com", "Operators").await;
    app.make_platform_admin(&op.id()).await;
    let user = app.signup("u@example.com", "Users Org").await;
    let tenants = op.get(&app, "/api/v1/admin/tenants").await;
    assert_eq!(tenants.as_array().unwrap().len(), 2);
    let users = op.get(&app, "/api/v1/admin/users").await;
    assert_eq!(users.as_array().unwrap().len(), 2);
    let res = op
        .send(
            &app,
            Method::PATCH,
            &format!("/api/v1/admin/users/{}", user.id()),
            Some(json!({"disabled": true})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        user.send(&app, Method::GET, "/api/v1/me", None)
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );
    let res = op
        .send(
            &app,
            Method::PATCH,
            &format!("/api/v1/admin/users/{}", op.id()),
            Some(json!({"disabled": true})),
        )
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    let res = op
        .send(
            &app,
            Method::PATCH,
            "/api/v1/admin/users/nobody",
            Some(json!({"disabled": true})),
        )
        .await;
    assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
    let res = op
        .send(
            &app,
            Method::PATCH,
            &format!("/api/v1/admin/users/{}", user.id()),
            Some(json!({"disabled": false, "platform_admin": true})),
        )
        .await;
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["platform_admin"], true);
    assert_eq!(body["disabled"], false);
}

async fn tenants_are_isolated(b: Backend) {
    let app = spawn_app(b).await;
    let a = app.signup("a@example.com", "Tenant A").await;
    let bob = app.signup("b@example.com", "Tenant B").await;
    let b_member = app.invite_and_join(&bob, "bm@example.com", "member").await;
    let b_inv: Value = bob
        .send(
            &app,
            Method::POST,
            "/api/v1/tenant/invitations",
            Some(json!({"email": "pending@example.com"})),
        )
        .await
        .json()
        .await
        .unwrap();
    let bm = b_member.id();
    let calls = [
        (
            Method::PATCH,
            format!("/api/v1/tenant/members/{bm}"),
            Some(json!({"role": "admin"})),
        ),
        (Method::DELETE, format!("/api/v1/tenant/members/{bm}"), None),
        (
            Method::GET,
            format!("/api/v1/tenant/members/{bm}/quota"),
            None,
        ),
        (
            Method::PUT,
            format!("/api/v1/tenant/members/{bm}/quota"),
            Some(json!({"max_gpus": 1})),
        ),
        (
            Method::DELETE,
            format!(
                "/api/v1/tenant/invitations/{}",
                b_inv["id"].as_str().unwrap()
            ),
            None,
        ),
    ];
    for (method, path, body) in calls {
        let res = a.send(&app, method.clone(), &path, body).await;
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{method} {path}");
        assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
    }
    // A's views list only A's people; B is unchanged.
    let members = a.get(&app, "/api/v1/tenant/members").await;
    assert_eq!(members.as_array().unwrap().len(), 1);
    assert!(a
        .get(&app, "/api/v1/tenant/invitations")
        .await
        .as_array()
        .unwrap()
        .is_empty());
    let b_members = bob.get(&app, "/api/v1/tenant/members").await;
    let bm_row = b_members
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == bm.as_str())
        .unwrap();
    assert_eq!(bm_row["role"], "member");
    assert_eq!(bm_row["disabled"], false);
    assert_eq!(
        bob.get(&app, &format!("/api/v1/tenant/members/{bm}/quota"))
            .await["max_gpus"],
        Value::Null
    );
    assert_eq!(
        bob.get(&app, "/api/v1/tenant/invitations")
            .await
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // A tenant owner is no platform admin.
    let res = a
        .send(
            &app,
            Method::PUT,
            &format!(
                "/api/v1/admin/tenants/{}/quota",
                bob.user["tenant_id"].as_str().unwrap()
            ),
            Some(json!({"max_gpus": 0})),
        )
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
}
