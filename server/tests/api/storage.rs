//! Object storage against a real S3 protocol server (s3s-fs, in process) and the local folder
//! store: the store itself, checkpoints and results through the agent API, tenant isolation,
//! bad input and an unreachable S3, and checkpoints surviving a drain end to end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::web::Bytes;
use autodl_server::config::Settings;
use autodl_server::storage::{self, ObjectStore, Storage};
use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::agents::FakeAgent;
use crate::e2e::{log_text, start_agent, submit, wait_for};
use crate::gangs::result_files;
use crate::helpers::{assert_error, spawn_app_with, Backend, Session, TestApp};
use crate::s3_server;

crate::on_both_backends!(
    checkpoints_are_atomic_kept_and_handed_to_the_next_attempt,
    objects_stay_inside_their_tenant,
    bad_storage_input_is_refused,
    unreachable_storage_is_reported_not_fatal,
    checkpoints_survive_a_drain_and_results_come_back,
    the_results_of_failed_and_timed_out_runs_are_kept,
    given_up_and_replaced_uploads_free_their_space_at_once,
);

fn s3_settings(endpoint: &str) -> Settings {
    let mut s = Settings::default();
    s3_server::configure(&mut s, endpoint, "autodl");
    s
}

async fn read(store: &dyn ObjectStore, bucket: &str, key: &str) -> Vec<u8> {
    storage::read_all(store, bucket, key).await.unwrap()
}

/// put/get/list/delete, a multipart upload over 100 MB that is invisible until complete, on one
/// backend.
async fn exercise_store(store: Arc<dyn ObjectStore>, bucket: &str) {
    assert!(store.bucket_exists(bucket).await.unwrap());
    storage::put_bytes(
        store.as_ref(),
        bucket,
        "p/a.txt",
        Bytes::from_static(b"alpha"),
    )
    .await
    .unwrap();
    storage::put_bytes(
        store.as_ref(),
        bucket,
        "p/sub/b.txt",
        Bytes::from_static(b"beta!"),
    )
    .await
    .unwrap();
    assert_eq!(read(store.as_ref(), bucket, "p/a.txt").await, b"alpha");
    let keys: Vec<(String, u64)> = store
        .list(bucket, "p/")
        .await
        .unwrap()
        .into_iter()
        .map(|o| (o.key, o.size))
        .collect();
    assert_eq!(keys, vec![("a.txt".into(), 5), ("sub/b.txt".into(), 5)]);
    assert!(matches!(
        store.get(bucket, "p/missing").await,
        Err(storage::StorageError::NotFound)
    ));

    // 110 MB in 1 MiB writes: several multipart parts on S3.
    let mut up = store.start_upload(bucket, "big/blob.bin").await.unwrap();
    let mut sent = Sha256::new();
    let mut total = 0u64;
    for i in 0..110u32 {
        let chunk: Vec<u8> = (0..1_000_000u32)
            .map(|j| (j.wrapping_mul(31) ^ i) as u8)
            .collect();
        sent.update(&chunk);
        total += chunk.len() as u64;
        up.write(Bytes::from(chunk)).await.unwrap();
        if i == 60 {
            assert!(
                store.list(bucket, "big/").await.unwrap().is_empty(),
                "an unfinished upload must not be visible"
            );
        }
    }
    assert_eq!(up.finish().await.unwrap(), total);
    let listed = store.list(bucket, "big/").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].size, total);
    let (size, mut body) = store.get(bucket, "big/blob.bin").await.unwrap();
    assert_eq!(size, total);
    let mut got = Sha256::new();
    while let Some(c) = body.next().await {
        got.update(c.unwrap());
    }
    assert_eq!(
        got.finalize(),
        sent.finalize(),
        "the object reads back intact"
    );

    // An aborted upload leaves nothing.
    let mut up = store.start_upload(bucket, "big/aborted.bin").await.unwrap();
    up.write(Bytes::from(vec![1u8; 9 << 20])).await.unwrap();
    up.abort().await;
    assert_eq!(store.list(bucket, "big/").await.unwrap().len(), 1);

    assert_eq!(
        storage::delete_prefix(store.as_ref(), bucket, "p/")
            .await
            .unwrap(),
        2
    );
    assert!(store.list(bucket, "p/").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_store_puts_gets_lists_and_uploads_in_parts() {
    let s3 = s3_server::start(&["autodl"]).await;
    let storage = Storage::from_settings(&s3_settings(&s3.endpoint)).unwrap();
    assert!(!storage.backend.bucket_exists("nope").await.unwrap());
    exercise_store(storage.backend.clone(), "autodl").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_store_puts_gets_lists_and_uploads_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let s = Settings {
        storage_url: format!("file://{}", dir.path().display()),
        ..Settings::default()
    };
    let storage = Storage::from_settings(&s).unwrap();
    exercise_store(storage.backend.clone(), "autodl").await;
    // An upload dropped half way (its request broke) removes its temporary file at once...
    let uploads = dir.path().join(".uploads");
    let mut up = storage
        .backend
        .start_upload("autodl", "x/y.bin")
        .await
        .unwrap();
    up.write(Bytes::from_static(b"partial")).await.unwrap();
    drop(up);
    assert_eq!(std::fs::read_dir(&uploads).unwrap().count(), 0);
    // ...and one the server never came back to (it was killed) is removed by the sweep;
    // nothing ever became visible.
    let mut up = storage
        .backend
        .start_upload("autodl", "x/y.bin")
        .await
        .unwrap();
    up.write(Bytes::from_static(b"partial")).await.unwrap();
    std::mem::forget(up);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        storage
            .backend
            .sweep_abandoned(Duration::from_millis(1))
            .await
            .unwrap(),
        1
    );
    assert!(storage
        .backend
        .list("autodl", "x/")
        .await
        .unwrap()
        .is_empty());
}

async fn s3_app(b: Backend, endpoint: &str, tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let endpoint = endpoint.to_owned();
    spawn_app_with(b, move |s| {
        s3_server::configure(s, &endpoint, "autodl");
        tweak(s);
    })
    .await
}

/// A task running on a fake agent: (task id, attempt).
async fn running_task(app: &TestApp, s: &Session, agent: &FakeAgent, spec: Value) -> (String, u64) {
    let (id, attempt, _) = agent.placed(app, s, spec).await;
    let r = agent
        .call(
            &format!("/api/v1/agent/tasks/{id}/started"),
            json!({"attempt": attempt}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    (id, attempt)
}

impl FakeAgent {
    pub async fn put_file(&self, artifact: &str, path: &str, body: Vec<u8>) -> reqwest::Response {
        self.http
            .put(format!(
                "{}/api/v1/agent/artifacts/{artifact}/files/{path}",
                self.base
            ))
            .bearer_auth(&self.credential)
            .body(body)
            .send()
            .await
            .unwrap()
    }

    /// Uploads one checkpoint (or results) and commits it; returns its id.
    pub async fn save(
        &self,
        task: &str,
        attempt: u64,
        kind: &str,
        step: i64,
        files: &[(&str, &[u8])],
    ) -> String {
        let res = self
            .call(
                &format!("/api/v1/agent/tasks/{task}/artifacts"),
                json!({"attempt": attempt, "kind": kind, "step": step}),
            )
            .await;
        assert_eq!(res.status(), StatusCode::CREATED);
        let id = res.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let mut listed = Vec::new();
        for (p, body) in files {
            assert_eq!(
                self.put_file(&id, p, body.to_vec()).await.status(),
                StatusCode::NO_CONTENT
            );
            listed.push(json!({"path": p, "size": body.len()}));
        }
        let res = self
            .call(
                &format!("/api/v1/agent/artifacts/{id}/commit"),
                json!({"files": listed}),
            )
            .await;
        assert_eq!(
            res.status(),
            StatusCode::OK,
            "{}",
            res.text().await.unwrap()
        );
        id
    }
}

async fn checkpoints_are_atomic_kept_and_handed_to_the_next_attempt(b: Backend) {
    let s3 = s3_server::start(&["autodl"]).await;
    let app = s3_app(b, &s3.endpoint, |_| {}).await;
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "gpu-1", "A100-40G", "z1").await;
    let s = app.signup("ada@example.com", "Lab").await;
    let spec = json!({"name": "ckpt", "image": "busybox", "command": "train", "resources": {"gpu": {"count": 1}},
                      "checkpoint": {"interval": 60, "keep": 2}});
    let (id, attempt) = running_task(&app, &s, &agent, spec).await;
    // Files uploaded but not committed: no checkpoint yet.
    let res = agent
        .call(
            &format!("/api/v1/agent/tasks/{id}/artifacts"),
            json!({"attempt": attempt, "kind": "checkpoint", "step": 1}),
        )
        .await;
    let open = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        agent
            .put_file(&open, "model/w.pt", vec![1; 1000])
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        s.get(&app, &format!("/api/v1/tasks/{id}/checkpoints"))
            .await,
        json!([])
    );
    // A commit that claims a wrong size or a file never sent is refused; nothing is listed.
    let res = agent
        .call(
            &format!("/api/v1/agent/artifacts/{open}/commit"),
            json!({"files": [{"path": "model/w.pt", "size": 999}]}),
        )
        .await;
    assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    let res = agent
        .call(
            &format!("/api/v1/agent/artifacts/{open}/commit"),
            json!({"files": [{"path": "model/w.pt", "size": 1000}, {"path": "opt.pt", "size": 5}]}),
        )
        .await;
    assert_error(res, StatusCode::BAD_REQUEST, "validation").await;
    assert_eq!(
        s.get(&app, &format!("/api/v1/tasks/{id}/checkpoints"))
            .await,
        json!([])
    );
    // Reserved and unsafe names are not places an agent may write.
    for bad in [".autodl-manifest.json", "a//b"] {
        let r = agent.put_file(&open, bad, vec![1]).await;
        assert_error(r, StatusCode::FORBIDDEN, "forbidden").await;
    }

    // Three checkpoints with keep = 2: the oldest is deleted from the bucket too.
    let first = agent
        .save(
            &id,
            attempt,
            "checkpoint",
            10,
            &[("model/w.pt", b"step-10")],
        )
        .await;
    agent
        .save(
            &id,
            attempt,
            "checkpoint",
            20,
            &[("model/w.pt", b"step-20")],
        )
        .await;
    let third = agent
        .save(
            &id,
            attempt,
            "checkpoint",
            30,
            &[("model/w.pt", b"step-30"), ("opt.pt", b"o")],
        )
        .await;
    // A commit repeated after a lost answer gets the same answer.
    let again = agent
        .call(
            &format!("/api/v1/agent/artifacts/{third}/commit"),
            json!({"files": [{"path": "model/w.pt", "size": 7}, {"path": "opt.pt", "size": 1}]}),
        )
        .await;
    assert_eq!(again.status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(300)).await; // retention runs after the answer
    let cps = s
        .get(&app, &format!("/api/v1/tasks/{id}/checkpoints"))
        .await;
    let cps = cps.as_array().unwrap();
    assert_eq!(cps.len(), 2);
    assert_eq!(cps[0]["id"], third.as_str());
    assert_eq!(cps[0]["step"], 30);
    assert_eq!(cps[0]["files"], 2);
    assert_eq!(cps[0]["size_bytes"], 8);
    assert!(cps[0]["location"]
        .as_str()
        .unwrap()
        .starts_with("s3://autodl/checkpoints/"));
    let bucket_files: Vec<String> = walk(&s3.root.path().join("autodl"));
    assert!(
        !bucket_files.iter().any(|f| f.contains(&first)),
        "the oldest checkpoint's objects are gone: {bucket_files:?}"
    );
    assert!(bucket_files
        .iter()
        .any(|f| f.contains(&third) && f.ends_with(".autodl-manifest.json")));
    let events = s.get(&app, &format!("/api/v1/tasks/{id}/events")).await;
    assert!(events.to_string().contains("step 30"), "{events}");

    // Drained: the next attempt's assignment names the newest checkpoint and its files, and
    // the node running it can download them.
    let agent2 = FakeAgent::join(&app, &op, "gpu-2", "A100-40G", "z1").await;
    op.send(&app, Method::POST, "/api/v1/admin/nodes/gpu-1/drain", None)
        .await;
    let stop = agent.poll(&[(id.clone(), attempt)], 1).await;
    assert_eq!(stop["stop"][0]["task_id"], id.as_str());
    agent
        .call(
            &format!("/api/v1/agent/tasks/{id}/finished"),
            json!({"attempt": attempt, "exit_code": 0, "reason": "stopped"}),
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let assignment = loop {
        let work = agent2.poll(&[], 1).await;
        if let Some(a) = work["assignments"].as_array().unwrap().first() {
            break a.clone();
        }
        assert!(Instant::now() < deadline, "never reassigned");
    };
    assert_eq!(assignment["attempt"], 2);
    assert_eq!(assignment["restore"]["checkpoint_id"], third.as_str());
    assert_eq!(assignment["restore"]["step"], 30);
    assert_eq!(assignment["restore"]["files"].as_array().unwrap().len(), 2);
    let file = |who: &FakeAgent| {
        who.http
            .get(format!(
                "{}/api/v1/agent/artifacts/{third}/files/model/w.pt",
                who.base
            ))
            .bearer_auth(&who.credential)
            .send()
    };
    let got = file(&agent2).await.unwrap();
    assert_eq!(got.status(), StatusCode::OK);
    assert_eq!(got.bytes().await.unwrap().as_ref(), b"step-30");
    // The drained node no longer runs it and may not read it.
    assert_eq!(file(&agent).await.unwrap().status(), StatusCode::CONFLICT);
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in walkdir::WalkDir::new(dir).into_iter().flatten() {
        if e.file_type().is_file() {
            out.push(e.path().display().to_string());
        }
    }
    out
}

async fn put_object(
    app: &TestApp,
    s: &Session,
    path: &str,
    body: &'static [u8],
) -> reqwest::Response {
    s.request(
        app,
        Method::PUT,
        &format!("/api/v1/objects/datasets/{path}"),
    )
    .body(body)
    .send()
    .await
    .unwrap()
}

async fn objects_stay_inside_their_tenant(b: Backend) {
    let s3 = s3_server::start(&["autodl", "datasets"]).await;
    let app = s3_app(b, &s3.endpoint, |s| {
        s.storage_buckets = vec!["datasets".into()]
    })
    .await;
    let alice = app.signup("alice@example.com", "Alpha").await;
    let bob = app.signup("bob@example.com", "Beta").await;
    assert_eq!(
        put_object(&app, &alice, "mnist/train.bin", b"alice-data")
            .await
            .status(),
        StatusCode::CREATED
    );
    assert_eq!(
        put_object(&app, &bob, "mnist/train.bin", b"bob-data")
            .await
            .status(),
        StatusCode::CREATED
    );
    // Same path, different tenants, different objects.
    for (s, want) in [(&alice, "alice-data"), (&bob, "bob-data")] {
        let got = s
            .send(
                &app,
                Method::GET,
                "/api/v1/objects/datasets/mnist/train.bin",
                None,
            )
            .await;
        assert_eq!(got.status(), StatusCode::OK);
        assert_eq!(got.text().await.unwrap(), want);
        let list = s.get(&app, "/api/v1/objects/datasets?prefix=mnist").await;
        assert_eq!(
            list,
            json!([{"path": "mnist/train.bin", "size": want.len(), "etag": list[0]["etag"]}])
        );
    }
    // No path leaves the tenant's area, and other buckets are not reachable.
    for path in ["../x/mnist/train.bin", "mnist/../../train.bin"] {
        let r = alice
            .send(
                &app,
                Method::GET,
                &format!("/api/v1/objects/datasets/{path}"),
                None,
            )
            .await;
        assert!(
            r.status() == StatusCode::BAD_REQUEST || r.status() == StatusCode::NOT_FOUND,
            "{path}: {}",
            r.status()
        );
    }
    let r = alice
        .send(
            &app,
            Method::GET,
            "/api/v1/objects/secret/mnist/train.bin",
            None,
        )
        .await;
    assert_error(r, StatusCode::BAD_REQUEST, "validation").await;
    let r = bob
        .send(
            &app,
            Method::GET,
            "/api/v1/objects/datasets/nothing-here",
            None,
        )
        .await;
    assert_error(r, StatusCode::NOT_FOUND, "not_found").await;
    // On disk the two live under different tenant prefixes.
    let files = walk(&s3.root.path().join("datasets"));
    assert_eq!(
        files
            .iter()
            .filter(|f| f.ends_with("mnist/train.bin"))
            .count(),
        2
    );
    // The platform's own area is read-only to users.
    let r = put_object(&app, &alice, "checkpoints/forged/x", b"no").await;
    assert_error(r, StatusCode::FORBIDDEN, "forbidden").await;
    // Only managers delete; the owner of a tenant is one.
    let r = alice
        .send(
            &app,
            Method::DELETE,
            "/api/v1/objects/datasets/mnist/train.bin",
            None,
        )
        .await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = alice
        .send(
            &app,
            Method::GET,
            "/api/v1/objects/datasets/mnist/train.bin",
            None,
        )
        .await;
    assert_error(r, StatusCode::NOT_FOUND, "not_found").await;
    let r = bob
        .send(
            &app,
            Method::GET,
            "/api/v1/objects/datasets/mnist/train.bin",
            None,
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);

    // A task's results are its tenant's alone.
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "gpu-1", "A100-40G", "z1").await;
    let (id, attempt) = running_task(
        &app,
        &alice,
        &agent,
        json!({"name": "r", "image": "i", "command": "c", "resources": {"gpu": {"count": 1}}}),
    )
    .await;
    agent
        .save(&id, attempt, "results", 0, &[("out.txt", b"secret result")])
        .await;
    let r = bob
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/tasks/{id}/results"),
            None,
        )
        .await;
    assert_error(r, StatusCode::NOT_FOUND, "not_found").await;
    let r = alice
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/tasks/{id}/results"),
            None,
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let tar = r.bytes().await.unwrap();
    let mut archive = tar::Archive::new(tar.as_ref());
    let mut entries = archive.entries().unwrap();
    let mut e = entries.next().unwrap().unwrap();
    assert_eq!(e.path().unwrap().to_str(), Some("out.txt"));
    let mut text = String::new();
    std::io::Read::read_to_string(&mut e, &mut text).unwrap();
    assert_eq!(text, "secret result");
}

async fn bad_storage_input_is_refused(b: Backend) {
    let s3 = s3_server::start(&["autodl"]).await;
    // "ghost" is allowed by configuration but was never created in S3.
    let app = s3_app(b, &s3.endpoint, |s| {
        s.storage_buckets = vec!["ghost".into()]
    })
    .await;
    let _op = app.operator_with_nodes().await;
    let s = app.signup("ada@example.com", "Lab").await;
    let task = |ckpt: Value| json!({"name": "t", "image": "i", "command": "c", "resources": {"gpu": {"count": 1}}, "checkpoint": ckpt});
    for (ckpt, field, needle) in [
        (
            json!({"save_to": "s3://elsewhere/runs"}),
            "checkpoint.save_to",
            "not one",
        ),
        (
            json!({"save_to": "s3://autodl/runs/../../other"}),
            "checkpoint.save_to",
            "..",
        ),
        (
            json!({"save_to": "s3://ghost/runs"}),
            "checkpoint.save_to",
            "does not exist",
        ),
        (
            json!({"save_to": "runs/exp1"}),
            "checkpoint.save_to",
            "s3://",
        ),
        (
            json!({"interval": 60, "keep": 0}),
            "checkpoint.keep",
            "at least 1",
        ),
    ] {
        let r = s
            .send(
                &app,
                Method::POST,
                "/api/v1/tasks",
                Some(task(ckpt.clone())),
            )
            .await;
        let body = assert_error(r, StatusCode::BAD_REQUEST, "validation").await;
        assert_eq!(body["error"]["field"], field, "{ckpt}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(needle),
            "{ckpt}: {body}"
        );
    }
    let r = s
        .send(&app, Method::POST, "/api/v1/tasks", Some(json!({"name": "t", "image": "i", "command": "c", "resources": {"gpu": {"count": 1}}, "data_path": "s3://elsewhere/d"})))
        .await;
    let body = assert_error(r, StatusCode::BAD_REQUEST, "validation").await;
    assert_eq!(body["error"]["field"], "data_path");
    // A data path must name something stored: an empty folder would train on nothing.
    let with_data = json!({"name": "t", "image": "i", "command": "c", "resources": {"gpu": {"count": 1}}, "data_path": "s3://autodl/datasets/pets"});
    let r = s
        .send(&app, Method::POST, "/api/v1/tasks", Some(with_data.clone()))
        .await;
    let body = assert_error(r, StatusCode::BAD_REQUEST, "validation").await;
    assert_eq!(body["error"]["field"], "data_path");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nothing is stored under s3://autodl/datasets/pets"),
        "{body}"
    );
    let r = s
        .request(
            &app,
            Method::PUT,
            "/api/v1/objects/autodl/datasets/pets/labels.txt",
        )
        .body("cat\ndog\n")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let r = s
        .send(&app, Method::POST, "/api/v1/tasks", Some(with_data))
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    // A good one is accepted; nothing above was stored.
    let r = s
        .send(
            &app,
            Method::POST,
            "/api/v1/tasks",
            Some(task(json!({"save_to": "s3://autodl/runs/exp1", "keep": 3}))),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    // An absolute path names the folder inside the container; also fine.
    let r = s
        .send(
            &app,
            Method::POST,
            "/api/v1/tasks",
            Some(task(json!({"save_to": "/checkpoints"}))),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let list = s.get(&app, "/api/v1/tasks").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 3);
}

async fn unreachable_storage_is_reported_not_fatal(b: Backend) {
    // An S3 endpoint nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let app = s3_app(b, &format!("http://127.0.0.1:{port}"), |_| {}).await;
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "gpu-1", "A100-40G", "z1").await;
    let s = app.signup("ada@example.com", "Lab").await;
    // Submission does not wait for storage.
    let (id, attempt) = running_task(
        &app,
        &s,
        &agent,
        json!({"name": "t", "image": "i", "command": "c", "resources": {"gpu": {"count": 1}},
        "checkpoint": {"interval": 60, "save_to": "s3://autodl/runs"}}),
    )
    .await;
    let res = agent
        .call(
            &format!("/api/v1/agent/tasks/{id}/artifacts"),
            json!({"attempt": attempt, "kind": "checkpoint"}),
        )
        .await;
    let open = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = agent.put_file(&open, "w.pt", vec![0; 100]).await;
    assert_error(r, StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable").await;
    let events = s.get(&app, &format!("/api/v1/tasks/{id}/events")).await;
    assert!(
        events
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "storage_error"),
        "{events}"
    );
    let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
    assert_eq!(
        t["state"], "running",
        "a storage outage does not fail the task"
    );
}

/// A task that counts steps and asks for a checkpoint after each is drained half way: its
/// second attempt, on the other node, starts from the saved step; its results come back.
async fn checkpoints_survive_a_drain_and_results_come_back(b: Backend) {
    let s3 = s3_server::start(&["autodl"]).await;
    let app = s3_app(b, &s3.endpoint, |_| {}).await;
    let op = app.operator().await;
    let a1 = start_agent(&app, &op, "sim-1", "1xA40").await;
    let s = app.signup("ada@example.com", "Lab").await;
    let script = r#"
step=0
if [ "$AUTODL_IS_RESTORED" = 1 ]; then step=$(cat "$AUTODL_RESTORE_PATH/step"); echo "resumed from step $step"; fi
trap 'echo "$step" > "$AUTODL_CHECKPOINT_DIR/step"; echo "saved step $step on TERM"; exit 0' TERM
while [ "$step" -lt 30 ]; do
  step=$((step+1))
  echo "$step" > "$AUTODL_CHECKPOINT_DIR/step.tmp" && mv "$AUTODL_CHECKPOINT_DIR/step.tmp" "$AUTODL_CHECKPOINT_DIR/step"
  echo "{\"step\": $step}" > "$AUTODL_CHECKPOINT_DIR/.autodl-save"
  echo "step $step"
  sleep 0.2
done
mkdir -p "$AUTODL_RESULTS_DIR/plots"
echo "final $step" > "$AUTODL_RESULTS_DIR/summary.txt"
head -c 200000 /dev/zero | tr '\0' 'x' > "$AUTODL_RESULTS_DIR/plots/loss.csv"
"#;
    let res = s
        .send(
            &app,
            Method::POST,
            "/api/v1/tasks",
            Some(
                json!({"name": "counter", "image": "none", "command": script,
            "resources": {"gpu": {"count": 1}}, "checkpoint": {"interval": 10, "keep": 2}}),
            ),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Let it save a few steps, then drain its node with a second one ready.
    let deadline = Instant::now() + Duration::from_secs(30);
    while s
        .get(&app, &format!("/api/v1/tasks/{id}/checkpoints"))
        .await
        .as_array()
        .unwrap()
        .len()
        < 2
        || !log_text(&app, &s, &id).await.contains("step 8")
    {
        assert!(
            Instant::now() < deadline,
            "no checkpoints: {}",
            log_text(&app, &s, &id).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let a2 = start_agent(&app, &op, "sim-2", "1xA40").await;
    op.send(&app, Method::POST, "/api/v1/admin/nodes/sim-1/drain", None)
        .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
        if t["state"] == "completed" {
            break;
        }
        assert!(
            t["state"] != "failed",
            "{t}\n{}",
            log_text(&app, &s, &id).await
        );
        assert!(
            Instant::now() < deadline,
            "never completed: {t}\n{}",
            log_text(&app, &s, &id).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let logs = log_text(&app, &s, &id).await;
    let saved: u32 = logs
        .lines()
        .find_map(|l| {
            l.strip_prefix("saved step ")?
                .strip_suffix(" on TERM")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no TERM save: {logs}"));
    let resumed: u32 = logs
        .lines()
        .find_map(|l| l.strip_prefix("resumed from step ")?.parse().ok())
        .unwrap_or_else(|| panic!("never resumed: {logs}"));
    assert!(
        resumed > 0 && resumed == saved,
        "resumed from {resumed}, saved {saved}: {logs}"
    );
    assert!(
        logs.contains("[autodl-agent] restored the checkpoint of attempt 1"),
        "{logs}"
    );
    let attempts = s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await;
    assert_eq!(attempts[1]["node"], "sim-2");
    assert!(
        s.get(&app, &format!("/api/v1/tasks/{id}/checkpoints"))
            .await
            .as_array()
            .unwrap()
            .len()
            <= 2
    );

    // Results: what the task wrote, as a tar archive.
    let r = s
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/tasks/{id}/results"),
            None,
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "application/x-tar");
    let tar = r.bytes().await.unwrap();
    let mut archive = tar::Archive::new(tar.as_ref());
    let mut got = std::collections::BTreeMap::new();
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        let path = e.path().unwrap().display().to_string();
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut body).unwrap();
        got.insert(path, body);
    }
    assert_eq!(got["summary.txt"], b"final 30\n");
    assert_eq!(got["plots/loss.csv"].len(), 200_000);
    // Or one file at a time, as bytes to save (never as a page of this site).
    let files = s
        .get(&app, &format!("/api/v1/tasks/{id}/results/files"))
        .await;
    let mut listed: Vec<(String, u64)> = files
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_owned(),
                f["size"].as_u64().unwrap(),
            )
        })
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            ("plots/loss.csv".to_owned(), 200_000),
            ("summary.txt".to_owned(), 9)
        ]
    );
    let r = s
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/tasks/{id}/results/files/plots/loss.csv"),
            None,
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "application/octet-stream");
    assert_eq!(
        r.headers()["content-disposition"],
        "attachment; filename=\"loss.csv\""
    );
    assert_eq!(r.bytes().await.unwrap().len(), 200_000);
    for path in [
        "%2E%2E%2Fsummary.txt",
        "plots",
        "nothing.txt",
        "plots/summary.txt",
    ] {
        let r = s
            .send(
                &app,
                Method::GET,
                &format!("/api/v1/tasks/{id}/results/files/{path}"),
                None,
            )
            .await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{path}");
    }
    for agent in [a1, a2] {
        agent.shutdown.cancel();
        let _ = agent.handle.await;
    }
}

/// A run that fails, or that its time limit stops, keeps what it left in its results folder
/// as a completed one does (a failed run's files often say why): a retried task has its last
/// attempt's.
async fn the_results_of_failed_and_timed_out_runs_are_kept(b: Backend) {
    let s3 = s3_server::start(&["autodl"]).await;
    let app = s3_app(b, &s3.endpoint, |_| {}).await;
    let op = app.operator().await;
    let agent = start_agent(&app, &op, "sim-1", "1xA40").await;
    let s = app.signup("ada@example.com", "Lab").await;

    let failing = r#"echo "attempt $AUTODL_ATTEMPT diverged at step 7" > "$AUTODL_RESULTS_DIR/why.txt"; echo 0.31 > "$AUTODL_RESULTS_DIR/损失 曲线.csv"; exit 3"#;
    let id = submit(
        &app,
        &s,
        json!({"name": "diverges", "image": "none", "command": failing,
        "retry_policy": {"max_retries": 1}, "resources": {"gpu": {"count": 1}}}),
    )
    .await;
    let t = wait_for(&app, &s, &id, &["failed", "completed"], 60).await;
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["attempts"], 2, "{t}");
    assert_eq!(
        result_files(&app, &s, &id).await["why.txt"],
        "attempt 2 diverged at step 7\n",
        "the last attempt's results"
    );
    // A file saved under its own name, whatever its characters.
    let r = s
        .send(
            &app,
            Method::GET,
            &format!(
                "/api/v1/tasks/{id}/results/files/%E6%8D%9F%E5%A4%B1%20%E6%9B%B2%E7%BA%BF.csv"
            ),
            None,
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.headers()["content-disposition"],
        "attachment; filename=\"__ __.csv\"; filename*=UTF-8''%E6%8D%9F%E5%A4%B1%20%E6%9B%B2%E7%BA%BF.csv"
    );
    assert_eq!(r.text().await.unwrap(), "0.31\n");

    let slow =
        r#"echo partial > "$AUTODL_RESULTS_DIR/curve.csv"; trap 'exit 0' TERM; sleep 120 & wait"#;
    let id = submit(
        &app,
        &s,
        json!({"name": "too-slow", "image": "none", "command": slow,
        "time_limit": "2s", "resources": {"gpu": {"count": 1}}}),
    )
    .await;
    let t = wait_for(&app, &s, &id, &["timed_out", "failed", "completed"], 60).await;
    assert_eq!(t["state"], "timed_out", "{t}");
    assert_eq!(result_files(&app, &s, &id).await["curve.csv"], "partial\n");

    // Without results: said plainly, whatever the end.
    let id = submit(
        &app,
        &s,
        json!({"name": "silent", "image": "none", "command": "exit 1",
        "resources": {"gpu": {"count": 1}}}),
    )
    .await;
    wait_for(&app, &s, &id, &["failed"], 60).await;
    let r = s
        .send(
            &app,
            Method::GET,
            &format!("/api/v1/tasks/{id}/results"),
            None,
        )
        .await;
    assert_error(r, StatusCode::NOT_FOUND, "no_results").await;
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

/// An upload the agent gives up on (storage full, a file changed) is deleted at once, and so
/// is one that a newer upload of the same kind replaces (its agent died): neither holds space
/// until the daily sweep. Results live under `results/` (the key used to say `resultss/`).
async fn given_up_and_replaced_uploads_free_their_space_at_once(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "up-1", "A100-40G", "z1").await;
    let s = app.signup("u@example.com", "Lab").await;
    let (id, attempt) = running_task(
        &app,
        &s,
        &agent,
        json!({"name": "saver", "image": "none", "command": "true",
               "resources": {"gpu": {"type": "A100", "count": 1}}}),
    )
    .await;
    let objects = app.dir.path().join("objects");
    let start = |kind: &'static str| {
        let (agent, id) = (&agent, id.clone());
        async move {
            let res = agent
                .call(
                    &format!("/api/v1/agent/tasks/{id}/artifacts"),
                    json!({"attempt": attempt, "kind": kind}),
                )
                .await;
            assert_eq!(res.status(), StatusCode::CREATED);
            res.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let holding = |upload: &str| {
        walk(&objects)
            .into_iter()
            .filter(|f| f.contains(upload))
            .collect::<Vec<_>>()
    };

    // Given up: two of three files arrived, then the agent abandons it.
    let first = start("results").await;
    for name in ["a.bin", "b.bin"] {
        let res = agent.put_file(&first, name, vec![7u8; 100_000]).await;
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
    }
    let held = holding(&first);
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(
        held.iter()
            .all(|f| f.contains(&format!("/results/{first}/"))),
        "{held:?}"
    );
    let res = agent
        .call(
            &format!("/api/v1/agent/artifacts/{first}/abandon"),
            json!({}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert!(
        holding(&first).is_empty(),
        "abandoned files are deleted at once"
    );
    let res = agent
        .call(
            &format!("/api/v1/agent/artifacts/{first}/abandon"),
            json!({}),
        )
        .await;
    assert_eq!(
        res.status(),
        StatusCode::NO_CONTENT,
        "abandoning twice is harmless"
    );
    let res = agent
        .call(
            &format!("/api/v1/agent/artifacts/{first}/commit"),
            json!({"files": [{"path": "a.bin", "size": 100000}]}),
        )
        .await;
    assert_eq!(
        res.status(),
        StatusCode::CONFLICT,
        "an abandoned upload cannot be committed"
    );

    // Replaced: an upload left open is deleted when the next one of its kind starts.
    let second = start("checkpoint").await;
    let res = agent.put_file(&second, "model.pt", vec![1u8; 50_000]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(holding(&second).len(), 1);
    let third = start("checkpoint").await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !holding(&second).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the replaced upload still holds space"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The new one is untouched and completes.
    let res = agent.put_file(&third, "model.pt", vec![2u8; 50_000]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let res = agent
        .call(
            &format!("/api/v1/agent/artifacts/{third}/commit"),
            json!({"files": [{"path": "model.pt", "size": 50000}]}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(holding(&third).iter().any(|f| f.ends_with("/model.pt")));
}
