//! Single sign-on against a real OpenID provider (`oidc-provider` from the npm registry, run
//! with Node: `tests/oidc/provider.mjs`), the way a browser goes through it: the server's
//! start, the provider's sign-in form, the callback.

use std::process::Stdio;
use std::time::Duration;

use reqwest::{redirect, Client, Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::helpers::{assert_error, spawn_app_with, Backend, TestApp, PASSWORD};

crate::on_both_backends!(
    organizations_sign_people_in_with_their_provider,
    refused_tokens_states_and_people_make_no_session,
    rotated_provider_keys_are_read_again,
    password_sign_in_can_be_turned_off,
    an_organizations_provider_reaches_only_its_own_people,
    settings_are_checked_and_kept_to_their_owners,
    the_platforms_provider_gives_newcomers_an_organization,
    an_admin_cannot_take_over_through_single_sign_on,
);

/// The provider process; killed when dropped.
struct Provider {
    child: tokio::process::Child,
    issuer: String,
    args: Vec<String>,
}

impl Provider {
    async fn start(app: &TestApp, claims_in_id_token: bool) -> Provider {
        let clients = json!([{
            "client_id": "autodl",
            "client_secret": "provider-given-secret",
            "redirect_uris": [app.url("/api/v1/auth/sso/callback")],
        }]);
        let mut args = vec!["--clients".to_owned(), clients.to_string()];
        if claims_in_id_token {
            args.push("--claims-in-id-token".into());
        }
        Self::spawn(args, "0").await
    }

    async fn spawn(args: Vec<String>, port: &str) -> Provider {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/oidc/provider.mjs");
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/oidc");
        assert!(
            std::path::Path::new(dir).join("node_modules/oidc-provider").exists(),
            "the OpenID provider is not installed: run `npm ci` in tests/oidc (scripts/test.sh does)"
        );
        let mut child = tokio::process::Command::new("node")
            .arg(script)
            .arg("--port")
            .arg(port)
            .args(&args)
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start node");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let issuer = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(l) = lines.next_line().await.unwrap() {
                if let Some(i) = l.strip_prefix("listening ") {
                    return i.to_owned();
                }
            }
            panic!("the provider exited before listening")
        })
        .await
        .expect("the provider did not start in 30 s");
        Provider {
            child,
            issuer,
            args,
        }
    }

    /// Stops and starts again on the same address: a new signing key, as after a rotation.
    async fn restart(mut self) -> Provider {
        let port = self.issuer.rsplit(':').next().unwrap().to_owned();
        self.child.kill().await.unwrap();
        let args = std::mem::take(&mut self.args);
        Self::spawn(args, &port).await
    }

    async fn control(&self, path: &str, body: Value) {
        let res = Client::new()
            .post(format!("{}/_test/{path}", self.issuer))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
    }

    async fn account(&self, email: &str, verified: bool, groups: &[&str]) {
        self.control(
            "account",
            json!({"email": email, "email_verified": verified, "groups": groups}),
        )
        .await;
    }

    fn settings(&self) -> Value {
        json!({
            "label": "Acme login",
            "issuer": self.issuer,
            "client_id": "autodl",
            "client_secret": "provider-given-secret",
            "allowed_domains": ["acme.test"],
            "scopes": ["groups"],
            "role_claim": "groups",
            "role_map": {"ml-admins": "admin", "ml": "member"},
        })
    }
}

/// A browser: cookies kept, redirects followed by hand.
fn browser() -> Client {
    Client::builder()
        .cookie_store(true)
        .redirect(redirect::Policy::none())
        .build()
        .unwrap()
}

fn location(res: &reqwest::Response) -> String {
    let to = res
        .headers()
        .get("location")
        .unwrap_or_else(|| panic!("no redirect: {}", res.status()))
        .to_str()
        .unwrap();
    res.url().join(to).unwrap().to_string()
}

/// Starts at the server, signs in at the provider as `login`, and stops at the callback URL
/// the provider sends the browser to (not yet visited).
async fn to_callback(app: &TestApp, b: &Client, provider_id: &str, login: &str) -> String {
    let start = format!("/api/v1/auth/sso/{provider_id}/start?return_to=/tasks");
    to_callback_from(app, b, &start, login).await
}

async fn to_callback_from(app: &TestApp, b: &Client, start: &str, login: &str) -> String {
    let res = b.get(app.url(start)).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let mut url = location(&res);
    assert!(!url.contains("sso_error"), "{url}");
    for _ in 0..10 {
        if url.starts_with(&app.url("/api/v1/auth/sso/callback")) {
            return url;
        }
        let res = b.get(&url).send().await.unwrap();
        if res.status() == StatusCode::OK {
            // The provider's sign-in form: it posts back to its own address.
            let page = res.text().await.unwrap();
            assert!(page.contains("name=\"login\""), "{page}");
            let res = b
                .post(&url)
                .form(&[("prompt", "login"), ("login", login), ("password", "any")])
                .send()
                .await
                .unwrap();
            url = location(&res);
        } else {
            url = location(&res);
        }
    }
    panic!("never came back to the callback; last at {url}")
}

/// A whole sign-in: where the browser ends up after the callback.
async fn sign_in(app: &TestApp, b: &Client, provider_id: &str, login: &str) -> String {
    let callback = to_callback(app, b, provider_id, login).await;
    let res = b.get(&callback).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    location(&res)
}

async fn me(app: &TestApp, b: &Client) -> (StatusCode, Value) {
    let res = b.get(app.url("/api/v1/me")).send().await.unwrap();
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

fn refusal(url: &str) -> String {
    let u = url::Url::parse(url).unwrap();
    assert_eq!(u.path(), "/login", "{url}");
    u.query_pairs()
        .find(|(k, _)| k == "sso_error")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| panic!("no sso_error in {url}"))
}

async fn sso_app(backend: Backend) -> TestApp {
    spawn_app_with(backend, |s| s.sso_allow_internal = true).await
}

async fn configure(app: &TestApp, owner: &crate::helpers::Session, body: Value) -> Value {
    let res = owner
        .send(app, Method::PUT, "/api/v1/tenant/sso", Some(body))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    res.json().await.unwrap()
}

/// Sets up `op` for the owner's organization, giving unmapped people `role`; the provider's id.
async fn configure_with_default(
    app: &TestApp,
    owner: &crate::helpers::Session,
    op: &Provider,
    role: &str,
) -> String {
    let mut settings = op.settings();
    settings["default_role"] = json!(role);
    configure(app, owner, settings).await["provider"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn audit_actions(app: &TestApp, who: &crate::helpers::Session) -> Vec<Value> {
    who.get(app, "/api/v1/audit?limit=200").await["records"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

async fn organizations_sign_people_in_with_their_provider(backend: Backend) {
    let app = sso_app(backend).await;
    let op = Provider::start(&app, false).await;
    let owner = app.signup("owner@acme.test", "Acme").await;
    let saved = configure(&app, &owner, op.settings()).await;
    let id = saved["provider"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        saved["provider"]["redirect_uri"],
        app.url("/api/v1/auth/sso/callback")
    );
    // The sign-in page lists it for an email of its domain, and to its own people; nobody
    // else learns which organizations have one.
    let listed = |query: &'static str| {
        let app = &app;
        async move {
            Client::new()
                .get(app.url(&format!("/api/v1/auth/sso/providers{query}")))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    assert_eq!(
        listed("?email=someone@ACME.test").await,
        json!([{"id": id, "label": "Acme login"}])
    );
    assert_eq!(listed("").await, json!([]));
    assert_eq!(listed("?email=someone@other.test").await, json!([]));
    assert_eq!(
        owner.get(&app, "/api/v1/auth/sso/providers").await,
        json!([{"id": id, "label": "Acme login"}])
    );
    let stranger = app.signup("eve@other.test", "Other").await;
    assert_eq!(
        stranger.get(&app, "/api/v1/auth/sso/providers").await,
        json!([])
    );

    // A first sign-in makes the account, in the organization, with the mapped role.
    op.account("ada@acme.test", true, &["ml-admins", "everyone"])
        .await;
    let ada = browser();
    assert!(sign_in(&app, &ada, &id, "ada@acme.test")
        .await
        .ends_with("/tasks"));
    let (status, me_ada) = me(&app, &ada).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(me_ada["email"], "ada@acme.test");
    assert_eq!(me_ada["role"], "admin");
    assert_eq!(me_ada["tenant_id"], owner.user["tenant_id"]);
    // Signing in again finds the same account.
    let again = browser();
    sign_in(&app, &again, &id, "ada@acme.test").await;
    assert_eq!(me(&app, &again).await.1["id"], me_ada["id"]);
    // The provider's groups keep deciding the role.
    op.account("ada@acme.test", true, &["ml"]).await;
    let third = browser();
    sign_in(&app, &third, &id, "ada@acme.test").await;
    assert_eq!(me(&app, &third).await.1["role"], "member");

    // The provider cannot claim the owner's account by email (its admins control it)...
    op.account("owner@acme.test", true, &["ml"]).await;
    let o = browser();
    let why = refusal(&sign_in(&app, &o, &id, "owner@acme.test").await);
    assert!(why.contains("not linked to this provider"), "{why}");
    assert_eq!(me(&app, &o).await.0, StatusCode::UNAUTHORIZED);
    // ...the owner links it, signed in; then it signs them in, and they stay owner whatever
    // the groups say.
    let res = o
        .post(app.url("/api/v1/auth/login"))
        .json(&json!({"email": "owner@acme.test", "password": PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let start = format!("/api/v1/auth/sso/{id}/start?link=true&return_to=/account");
    let callback = to_callback_from(&app, &o, &start, "owner@acme.test").await;
    let res = o.get(&callback).send().await.unwrap();
    assert!(location(&res).ends_with("/account"), "{}", location(&res));
    let later = browser();
    sign_in(&app, &later, &id, "owner@acme.test").await;
    let (_, me_owner) = me(&app, &later).await;
    assert_eq!(me_owner["id"], owner.user["id"]);
    assert_eq!(me_owner["role"], "owner");
    // Linking needs a session; another site cannot start a sign-in in someone's browser.
    let res = browser().get(app.url(&start)).send().await.unwrap();
    assert!(refusal(&location(&res)).contains("sign in first"));
    let res = browser()
        .get(app.url(&format!("/api/v1/auth/sso/{id}/start")))
        .header("Sec-Fetch-Site", "cross-site")
        .send()
        .await
        .unwrap();
    assert!(refusal(&location(&res)).contains("this site's sign-in page"));

    // Nobody from another domain, and nobody the groups give no role.
    let eve = browser();
    let why = refusal(&sign_in(&app, &eve, &id, "eve@evil.test").await);
    assert!(why.contains("may not sign in here"), "{why}");
    assert_eq!(me(&app, &eve).await.0, StatusCode::UNAUTHORIZED);
    op.account("sam@acme.test", true, &["sales"]).await;
    let sam = browser();
    let why = refusal(&sign_in(&app, &sam, &id, "sam@acme.test").await);
    assert!(why.contains("no role"), "{why}");
    assert_eq!(me(&app, &sam).await.0, StatusCode::UNAUTHORIZED);

    // The audit trail has the configuration, the sign-ins and the refusals.
    let records = audit_actions(&app, &owner).await;
    let has = |action: &str, pred: &dyn Fn(&Value) -> bool| {
        records.iter().any(|r| r["action"] == action && pred(r))
    };
    assert!(has("sso.configured", &|r| r["detail"]["issuer"]
        == op.issuer.as_str()));
    assert!(has("auth.sign_in", &|r| r["actor_email"]
        == "ada@acme.test"
        && r["detail"]["method"] == "sso"));
    assert!(has("auth.sign_in_failed", &|r| r["detail"]["reason"]
        .as_str()
        .is_some_and(|s| s.contains("no role"))));
}

async fn refused_tokens_states_and_people_make_no_session(backend: Backend) {
    let app = sso_app(backend).await;
    // Claims in the ID token this time (the other tests read them from userinfo).
    let op = Provider::start(&app, true).await;
    let owner = app.signup("owner@acme.test", "Acme").await;
    let id = configure_with_default(&app, &owner, &op, "member").await;

    for (mode, words) in [
        ("aud", "wrong audience"),
        ("expired", "expired"),
        ("nonce", "nonce"),
    ] {
        op.control("tamper", json!({"mode": mode})).await;
        let b = browser();
        let why = refusal(&sign_in(&app, &b, &id, "ada@acme.test").await);
        assert!(why.contains(words), "{mode}: {why}");
        assert_eq!(me(&app, &b).await.0, StatusCode::UNAUTHORIZED, "{mode}");
    }
    // Nothing was made of those attempts.
    assert!(app
        .state
        .store
        .user_by_email("ada@acme.test")
        .await
        .unwrap()
        .is_none());

    // A good sign-in, then its answer replayed: the state was used.
    let b = browser();
    let callback = to_callback(&app, &b, &id, "ada@acme.test").await;
    let res = b.get(&callback).send().await.unwrap();
    assert!(location(&res).ends_with("/tasks"));
    assert_eq!(me(&app, &b).await.0, StatusCode::OK);
    let replay = browser();
    let res = replay.get(&callback).send().await.unwrap();
    assert!(refusal(&location(&res)).contains("already used"));
    assert_eq!(me(&app, &replay).await.0, StatusCode::UNAUTHORIZED);

    // An answer carried to another browser (login CSRF) is refused there.
    let started_here = browser();
    let callback = to_callback(&app, &started_here, &id, "ada@acme.test").await;
    let elsewhere = browser();
    let res = elsewhere.get(&callback).send().await.unwrap();
    assert!(refusal(&location(&res)).contains("another browser"));

    // A made-up state, and the provider saying no.
    let res = browser()
        .get(app.url("/api/v1/auth/sso/callback?code=x&state=made-up"))
        .send()
        .await
        .unwrap();
    assert!(refusal(&location(&res)).contains("already used or has expired"));

    // No account is made for an email the provider did not verify.
    op.account("new@acme.test", false, &[]).await;
    let b = browser();
    let why = refusal(&sign_in(&app, &b, &id, "new@acme.test").await);
    assert!(why.contains("not verified your email"), "{why}");
    assert!(app
        .state
        .store
        .user_by_email("new@acme.test")
        .await
        .unwrap()
        .is_none());
    // An unverified email never takes over an existing account.
    app.invite_and_join(&owner, "bob@acme.test", "member").await;
    op.account("bob@acme.test", false, &[]).await;
    let b = browser();
    let why = refusal(&sign_in(&app, &b, &id, "bob@acme.test").await);
    assert!(why.contains("not linked to this provider"), "{why}");
}

async fn rotated_provider_keys_are_read_again(backend: Backend) {
    let app = sso_app(backend).await;
    let op = Provider::start(&app, false).await;
    let owner = app.signup("owner@acme.test", "Acme").await;
    let id = configure_with_default(&app, &owner, &op, "member").await;
    let b = browser();
    sign_in(&app, &b, &id, "ada@acme.test").await;
    assert_eq!(me(&app, &b).await.0, StatusCode::OK);
    // New signing key at the provider; the server holds the old key set.
    let op = op.restart().await;
    let b = browser();
    assert!(sign_in(&app, &b, &id, "ada@acme.test")
        .await
        .ends_with("/tasks"));
    assert_eq!(me(&app, &b).await.1["email"], "ada@acme.test");
    drop(op);
}

async fn password_sign_in_can_be_turned_off(backend: Backend) {
    let app = sso_app(backend).await;
    let op = Provider::start(&app, false).await;
    let owner = app.signup("owner@acme.test", "Acme").await;
    let member = app.invite_and_join(&owner, "bob@acme.test", "member").await;
    let saved = configure(&app, &owner, op.settings()).await;
    // bob links his account himself, signed in, while passwords still work.
    op.account("bob@acme.test", true, &["ml"]).await;
    let id = saved["provider"]["id"].as_str().unwrap().to_owned();
    let start = format!("/api/v1/auth/sso/{id}/start?link=true&return_to=/account");
    drop(member);
    let m = browser();
    let res = m
        .post(app.url("/api/v1/auth/login"))
        .json(&json!({"email": "bob@acme.test", "password": PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let callback = to_callback_from(&app, &m, &start, "bob@acme.test").await;
    let res = m.get(&callback).send().await.unwrap();
    assert!(location(&res).ends_with("/account"), "{}", location(&res));
    let mut settings = op.settings();
    settings["password_login"] = json!(false);
    let saved = configure(&app, &owner, settings).await;
    assert_eq!(saved["password_login"], false);

    let login = |email: &'static str| {
        let app = &app;
        async move {
            Client::new()
                .post(app.url("/api/v1/auth/login"))
                .json(&json!({"email": email, "password": PASSWORD}))
                .send()
                .await
                .unwrap()
        }
    };
    let body = assert_error(
        login("bob@acme.test").await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("single sign-on"));
    // Invitations cannot make password accounts either.
    let inv: Value = owner
        .send(
            &app,
            Method::POST,
            "/api/v1/tenant/invitations",
            Some(json!({"email": "cy@acme.test", "role": "member"})),
        )
        .await
        .json()
        .await
        .unwrap();
    let res = app
        .post_json(
            "/api/v1/auth/signup",
            &json!({"email": "cy@acme.test", "password": PASSWORD, "invitation": inv["token"]}),
        )
        .await;
    assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    // Its people sign in through the provider (bob's account is linked).
    let b = browser();
    assert!(sign_in(
        &app,
        &b,
        saved["provider"]["id"].as_str().unwrap(),
        "bob@acme.test"
    )
    .await
    .ends_with("/tasks"));
    assert_eq!(me(&app, &b).await.1["email"], "bob@acme.test");
    // Its owner keeps the password (the way back in), as a platform admin does.
    assert_eq!(login("owner@acme.test").await.status(), StatusCode::OK);
    // Existing sessions and the provider still work; removing it brings passwords back.
    let res = owner
        .send(&app, Method::DELETE, "/api/v1/tenant/sso", None)
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(login("bob@acme.test").await.status(), StatusCode::OK);
    let records = audit_actions(&app, &owner).await;
    assert!(records.iter().any(|r| r["action"] == "sso.removed"));
    assert!(records.iter().any(|r| r["action"] == "auth.sign_in_failed"
        && r["detail"]["reason"]
            .as_str()
            .is_some_and(|s| s.contains("password sign-in is off"))));
}

async fn an_organizations_provider_reaches_only_its_own_people(backend: Backend) {
    let app = sso_app(backend).await;
    let op = Provider::start(&app, false).await;
    // Another organization's person, and an admin whose provider claims their email.
    let victim = app.signup("victim@acme.test", "Victims").await;
    let owner = app.signup("owner@acme.test", "Acme").await;
    let id = configure_with_default(&app, &owner, &op, "admin").await;
    let b = browser();
    let why = refusal(&sign_in(&app, &b, &id, "victim@acme.test").await);
    assert!(why.contains("another organization"), "{why}");
    assert_eq!(me(&app, &b).await.0, StatusCode::UNAUTHORIZED);
    // The victim's account is untouched and still theirs.
    let (_, v) = me(&app, &victim.client).await;
    assert_eq!(v["tenant_id"], victim.user["tenant_id"]);
    assert_eq!(v["role"], "owner");
}

async fn settings_are_checked_and_kept_to_their_owners(backend: Backend) {
    // Default settings: organizations' providers only on public https addresses.
    let strict = spawn_app_with(backend, |_| {}).await;
    let op = Provider::start(&strict, false).await;
    let owner = strict.signup("owner@acme.test", "Acme").await;
    let res = owner
        .send(
            &strict,
            Method::PUT,
            "/api/v1/tenant/sso",
            Some(op.settings()),
        )
        .await;
    let body = assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    assert_eq!(body["error"]["field"], "issuer");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not https"));

    let app = sso_app(backend).await;
    let op = Provider::start(&app, false).await;
    let owner = app.signup("owner@acme.test", "Acme").await;
    let member = app.invite_and_join(&owner, "bob@acme.test", "member").await;
    for (path, method) in [
        ("/api/v1/tenant/sso", Method::GET),
        ("/api/v1/tenant/sso", Method::DELETE),
        ("/api/v1/admin/sso", Method::GET),
    ] {
        let res = member.send(&app, method, path, None).await;
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{path}");
    }
    let res = member
        .send(&app, Method::PUT, "/api/v1/tenant/sso", Some(op.settings()))
        .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    // An issuer that does not answer is refused before anything is kept.
    let mut s = op.settings();
    s["issuer"] = json!("http://127.0.0.1:1");
    let res = owner
        .send(&app, Method::PUT, "/api/v1/tenant/sso", Some(s))
        .await;
    let body = assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    assert_eq!(body["error"]["field"], "issuer");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("could not read http://127.0.0.1:1/.well-known/openid-configuration"));
    // Bad fields, each named.
    for (field, value) in [
        ("issuer", json!("ftp://idp.example.com")),
        ("allowed_domains", json!(["not a domain"])),
        ("role_map", json!({"ml": "owner"})),
        ("default_role", json!("king")),
        ("label", json!("")),
    ] {
        let mut s = op.settings();
        s[field] = value;
        let res = owner
            .send(&app, Method::PUT, "/api/v1/tenant/sso", Some(s))
            .await;
        let body = assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
        assert!(
            body["error"]["field"]
                .as_str()
                .is_some_and(|f| f.starts_with(field)),
            "{field}: {body}"
        );
    }
    // A role map names its claim.
    let mut s = op.settings();
    s.as_object_mut().unwrap().remove("role_claim");
    let res = owner
        .send(&app, Method::PUT, "/api/v1/tenant/sso", Some(s))
        .await;
    assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    let scope = autodl_server::store::SsoScope::Tenant(
        owner.user["tenant_id"].as_str().unwrap().to_owned(),
    );
    assert!(app
        .state
        .store
        .sso_provider_of(&scope)
        .await
        .unwrap()
        .is_none());
    let mut s = op.settings();
    s.as_object_mut().unwrap().remove("client_secret");
    let res = owner
        .send(&app, Method::PUT, "/api/v1/tenant/sso", Some(s.clone()))
        .await;
    let body = assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    assert_eq!(body["error"]["field"], "client_secret");
    // Saved once, the secret is kept when left out, and never shown.
    configure(&app, &owner, op.settings()).await;
    // It only ever goes to the issuer and client it was given for.
    let other = Provider::start(&app, false).await;
    let mut moved = other.settings();
    moved.as_object_mut().unwrap().remove("client_secret");
    let res = owner
        .send(&app, Method::PUT, "/api/v1/tenant/sso", Some(moved))
        .await;
    let body = assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    assert_eq!(body["error"]["field"], "client_secret");
    s["label"] = json!("Acme SSO");
    let saved = configure(&app, &owner, s).await;
    assert_eq!(saved["provider"]["label"], "Acme SSO");
    let text = owner
        .send(&app, Method::GET, "/api/v1/tenant/sso", None)
        .await
        .text()
        .await
        .unwrap();
    assert!(!text.contains("provider-given-secret"), "{text}");
    let b = browser();
    let id = saved["provider"]["id"].as_str().unwrap();
    op.account("ada@acme.test", true, &["ml"]).await;
    assert!(sign_in(&app, &b, id, "ada@acme.test")
        .await
        .ends_with("/tasks"));
}

async fn the_platforms_provider_gives_newcomers_an_organization(backend: Backend) {
    // The platform's provider may be internal even when organizations' may not.
    let app = spawn_app_with(backend, |_| {}).await;
    let op = Provider::start(&app, false).await;
    let admin = app.operator().await;
    let mut s = op.settings();
    s["label"] = json!("Company login");
    let res = admin
        .send(&app, Method::PUT, "/api/v1/admin/sso", Some(s.clone()))
        .await;
    let body = assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    assert_eq!(body["error"]["field"], "role_claim", "{body}");
    for k in ["role_claim", "role_map"] {
        s.as_object_mut().unwrap().remove(k);
    }
    let res = admin
        .send(&app, Method::PUT, "/api/v1/admin/sso", Some(s))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let saved: Value = res.json().await.unwrap();
    let id = saved["provider"]["id"].as_str().unwrap().to_owned();
    let b = browser();
    sign_in(&app, &b, &id, "new@acme.test").await;
    let (status, me_new) = me(&app, &b).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(me_new["role"], "owner");
    assert_ne!(me_new["tenant_id"], admin.user["tenant_id"]);
    // Existing people of any organization are linked by their verified email.
    let bob = app.signup("bob@acme.test", "Bobs").await;
    let b = browser();
    sign_in(&app, &b, &id, "bob@acme.test").await;
    assert_eq!(me(&app, &b).await.1["id"], bob.user["id"]);
    // Not the people of an organization that signs in through its own provider.
    let carol = app.signup("carol@acme.test", "Carols").await;
    app.state
        .store
        .set_password_login(carol.user["tenant_id"].as_str().unwrap(), false)
        .await
        .unwrap();
    let b = browser();
    let why = refusal(&sign_in(&app, &b, &id, "carol@acme.test").await);
    assert!(why.contains("organization's provider"), "{why}");
    let records = audit_actions(&app, &admin).await;
    assert!(records
        .iter()
        .any(|r| r["action"] == "sso.configured" && r["tenant_id"].is_null()));
}

/// An organization's admin (not its owner) tries to take the organization over through a
/// provider of their own: changing how people sign in is refused; and the owner's provider
/// cannot sign anyone in by claiming an existing account's email.
async fn an_admin_cannot_take_over_through_single_sign_on(backend: Backend) {
    let app = sso_app(backend).await;
    let op = Provider::start(&app, false).await;
    let owner = app.signup("owner@acme.test", "Acme").await;
    let admin = app
        .invite_and_join(&owner, "mallory@acme.test", "admin")
        .await;
    let _colleague = app
        .invite_and_join(&owner, "carol@acme.test", "admin")
        .await;
    let _member = app.invite_and_join(&owner, "bob@acme.test", "member").await;
    let mut settings = op.settings();
    settings["password_login"] = json!(false);
    let res = admin
        .send(
            &app,
            Method::PUT,
            "/api/v1/tenant/sso",
            Some(settings.clone()),
        )
        .await;
    let body = assert_error(res, StatusCode::FORBIDDEN, "forbidden").await;
    assert!(
        body["error"]["message"].as_str().unwrap().contains("owner"),
        "{body}"
    );
    let res = admin
        .send(&app, Method::DELETE, "/api/v1/tenant/sso", None)
        .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    // The owner turns passwords off and keeps their own way in.
    let saved = configure(&app, &owner, settings).await;
    let id = saved["provider"]["id"].as_str().unwrap().to_owned();
    let res = Client::new()
        .post(app.url("/api/v1/auth/login"))
        .json(&json!({"email": "owner@acme.test", "password": PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK, "the owner is locked out");
    // Whoever controls the provider claims existing people's emails: nobody is signed in.
    for (email, groups) in [
        ("owner@acme.test", &["ml-admins"][..]),
        ("carol@acme.test", &["ml-admins"]),
        ("bob@acme.test", &["ml"]),
    ] {
        op.account(email, true, groups).await;
        let b = browser();
        let why = refusal(&sign_in(&app, &b, &id, email).await);
        assert!(
            why.contains("not linked to this provider"),
            "{email}: {why}"
        );
        assert_eq!(me(&app, &b).await.0, StatusCode::UNAUTHORIZED, "{email}");
    }
    let records = audit_actions(&app, &owner).await;
    assert!(
        !records
            .iter()
            .any(|r| r["action"] == "auth.sign_in" && r["detail"]["method"] == "sso"),
        "{records:?}"
    );
}
