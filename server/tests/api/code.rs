//! Code travels with the task: a bundle is uploaded once, checked, kept per organization, and
//! unpacked fresh for every attempt as the task's working directory.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::e2e::{log_text, start_agent, submit, wait_for};
use crate::helpers::{assert_error, spawn_app_with, Backend, Session, TestApp};

crate::on_both_backends!(
    a_task_runs_in_its_uploaded_code_fresh_each_attempt,
    bundles_are_checked_and_stay_in_their_organization
);

/// A `.tar.gz` of these `(path, mode, bytes)` files, names written as given.
pub(crate) fn tar_gz(files: &[(&str, u32, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::default(),
    ));
    for (name, mode, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        h.set_entry_type(tar::EntryType::Regular);
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

pub(crate) async fn upload(app: &TestApp, s: &Session, bytes: Vec<u8>) -> reqwest::Response {
    s.request(app, Method::POST, "/api/v1/code")
        .header("content-type", "application/octet-stream")
        .body(bytes)
        .send()
        .await
        .unwrap()
}

async fn a_task_runs_in_its_uploaded_code_fresh_each_attempt(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let agent = start_agent(&app, &op, "sim-a100", "2xA100-40G").await;
    let s = app.signup("ada@example.com", "Lab").await;

    let bytes = tar_gz(&[
        (
            "./train.sh",
            0o755,
            b"#!/bin/sh\necho trained with $(cat conf/lr.txt)\n",
        ),
        ("conf/lr.txt", 0o644, b"lr=0.01"),
    ]);
    let res = upload(&app, &s, bytes.clone()).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let up: Value = res.json().await.unwrap();
    let id = up["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("sha256:") && id.len() == 71, "{up}");
    assert_eq!(
        (up["files"].clone(), up["format"].clone()),
        (json!(2), json!("tar.gz"))
    );
    // The same folder again is not stored twice; a lookup finds it; it downloads unchanged.
    let again: Value = upload(&app, &s, bytes.clone()).await.json().await.unwrap();
    assert_eq!(
        (again["id"].clone(), again["stored"].clone()),
        (json!(id), json!(false))
    );
    assert_eq!(
        s.get(&app, &format!("/api/v1/code/{id}")).await["size_bytes"],
        bytes.len()
    );
    let back = s
        .request(&app, Method::GET, &format!("/api/v1/code/{id}/archive"))
        .send()
        .await
        .unwrap();
    assert_eq!(back.bytes().await.unwrap().as_ref(), bytes.as_slice());

    // The first attempt runs the executable script from its code, litters the folder and
    // fails; the second finds the code as submitted.
    let task = submit(&app, &s, json!({"name": "coded", "image": "none", "code": id,
        "command": "./train.sh; echo cwd=$(pwd) code=$AUTODL_CODE_DIR; ls; if [ \"$AUTODL_ATTEMPT\" = 1 ]; then echo junk > junk.txt; exit 3; fi",
        "retry_policy": {"max_retries": 1}, "resources": {"gpu": {"count": 1}}})).await;
    let t = wait_for(&app, &s, &task, &["completed", "failed"], 40).await;
    assert_eq!(t["state"], "completed", "{t}");
    assert_eq!(t["spec"]["code"], json!(id));
    let text = log_text(&app, &s, &task).await;
    assert_eq!(text.matches("trained with lr=0.01").count(), 2, "{text}");
    let cwd = text
        .lines()
        .find_map(|l| l.strip_prefix("cwd="))
        .expect("the task printed its folder");
    let (cwd, code) = cwd.split_once(" code=").unwrap();
    assert_eq!(cwd, code, "the task starts in its code: {text}");
    assert_eq!(
        text.matches("junk.txt").count(),
        0,
        "an attempt starts from the code as submitted: {text}"
    );
    assert!(text.contains("[autodl-agent] code sha256:"), "{text}");
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

async fn bundles_are_checked_and_stay_in_their_organization(b: Backend) {
    let app = spawn_app_with(b, |s| s.code_max_bytes = 64 << 10).await;
    let alice = app.signup("alice@example.com", "Alpha").await;
    let bob = app.signup("bob@example.com", "Beta").await;

    let e = assert_error(
        upload(&app, &alice, b"just text".to_vec()).await,
        StatusCode::BAD_REQUEST,
        "validation",
    )
    .await;
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not a .tar.gz, .tar or .zip"),
        "{e}"
    );
    for name in ["../escape.py", "/etc/cron.d/x"] {
        let bad = tar_gz(&[("ok.py", 0o644, b"1"), (name, 0o644, b"2")]);
        let e = assert_error(
            upload(&app, &alice, bad).await,
            StatusCode::BAD_REQUEST,
            "validation",
        )
        .await;
        assert!(
            e["error"]["message"].as_str().unwrap().contains(name),
            "{e}"
        );
    }
    // Over the size limit: refused with the limit and what to leave out.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let noise: Vec<u8> = (0..200_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let e = assert_error(
        upload(&app, &alice, tar_gz(&[("big.bin", 0o644, &noise)])).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains(".autodlignore"),
        "{e}"
    );

    // Folders count: 150,000 empty ones pack into far less than the size limit.
    let mut folders = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::best(),
    ));
    for i in 0..150_000 {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        h.set_mode(0o755);
        folders
            .append_data(&mut h, format!("{i}/"), std::io::empty())
            .unwrap();
    }
    let folders = folders.into_inner().unwrap().finish().unwrap();
    let roomy = spawn_app_with(b, |_| {}).await;
    let carol = roomy.signup("carol@example.com", "Gamma").await;
    let e = assert_error(
        upload(&roomy, &carol, folders).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("files and folders"),
        "{e}"
    );

    let up: Value = upload(&app, &alice, tar_gz(&[("main.py", 0o644, b"print(1)")]))
        .await
        .json()
        .await
        .unwrap();
    let id = up["id"].as_str().unwrap();
    let task = |code: &str| json!({"name": "t", "image": "i", "command": "python main.py", "code": code, "resources": {"gpu": {"count": 1}}});
    // Another organization can neither see nor run it.
    let res = bob
        .request(&app, Method::GET, &format!("/api/v1/code/{id}"))
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
    let res = bob
        .request(&app, Method::GET, &format!("/api/v1/code/{id}/archive"))
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::NOT_FOUND, "not_found").await;
    let e = assert_error(
        bob.send(&app, Method::POST, "/api/v1/tasks", Some(task(id)))
            .await,
        StatusCode::BAD_REQUEST,
        "validation",
    )
    .await;
    assert_eq!(e["error"]["field"], "code");
    // A malformed id names the field and the form.
    let e = assert_error(
        alice
            .send(&app, Method::POST, "/api/v1/tasks", Some(task("main.py")))
            .await,
        StatusCode::BAD_REQUEST,
        "validation",
    )
    .await;
    assert_eq!(e["error"]["field"], "code");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("sha256:"),
        "{e}"
    );
    let res = alice
        .request(&app, Method::GET, "/api/v1/code/nope")
        .send()
        .await
        .unwrap();
    assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    // The owner submits it; no member can overwrite a bundle through the objects API.
    let res = alice
        .send(&app, Method::POST, "/api/v1/tasks", Some(task(id)))
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let hex = id.trim_start_matches("sha256:");
    let res = alice
        .request(
            &app,
            Method::PUT,
            &format!("/api/v1/objects/autodl/code/{hex}"),
        )
        .body("rm -rf /")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
}
