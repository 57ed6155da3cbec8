//! An attacker with an ordinary account on a shared host: organization B's task tries to reach
//! organization A's running task, the agent and the server through the host, on every runtime
//! the platform offers for shared use (the process runtime sandboxed, the process runtime as a
//! task uid without namespaces, and Docker). Every attempt must fail and A's data stay as it
//! was. Isolation needs root; the suite runs as root in CI.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use autodl_agent::{DockerRuntime, IsolationConfig, IsolationLevel, ProcessRuntime, Runtime};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::e2e::{log_text, start_agent_with, submit, wait_for};
use crate::helpers::{spawn_app, Backend, Session, TestApp};

crate::on_both_backends!(
    tasks_of_another_organization_reach_nothing_on_the_host,
    dataset_roots_are_read_only_and_links_stay_inside,
);

/// The runtimes to attack, with how a task names its image under them.
async fn runtimes() -> Vec<(&'static str, Arc<dyn Runtime>, String)> {
    if !autodl_agent::isolation::is_root() {
        eprintln!("skipped: isolating tasks needs root (CI runs the suite as root)");
        return Vec::new();
    }
    let sandbox = ProcessRuntime::detect(&IsolationConfig::default()).unwrap();
    assert_eq!(
        sandbox.isolation(),
        IsolationLevel::Sandbox,
        "bubblewrap is missing (scripts/test.sh installs it)"
    );
    // Without bubblewrap the process runtime still gives every task its own uid.
    let uid_only = ProcessRuntime::detect(&IsolationConfig {
        bwrap: Some(PathBuf::from("/nonexistent/bwrap")),
        ..IsolationConfig::default()
    })
    .unwrap();
    assert_eq!(uid_only.isolation(), IsolationLevel::Uid);
    let mut out: Vec<(&'static str, Arc<dyn Runtime>, String)> = vec![
        ("sandbox", Arc::new(sandbox), "none".into()),
        ("uid", Arc::new(uid_only), "none".into()),
    ];
    match std::env::var("AUTODL_TEST_DOCKER_IMAGE") {
        Ok(image) => {
            let docker = DockerRuntime::connect().await.expect("Docker engine");
            out.push(("docker", Arc::new(docker), image));
        }
        Err(_) => eprintln!(
            "Docker part skipped: AUTODL_TEST_DOCKER_IMAGE is not set (scripts/test.sh sets it)"
        ),
    }
    out
}

fn settings_path(url: &str, scheme: &str) -> String {
    url.strip_prefix(scheme).unwrap_or_default().to_owned()
}

/// Everything B's task tries. It prints `LEAK ...` for each attempt that succeeds.
const ATTACK: &str = r#"
leak() { echo "LEAK $1"; }
echo "uid=$(id -u)"
for f in "$A_DIR/results/secret.txt" "$A_DIR/checkpoints/ckpt.txt" "$A_DIR/.autodl-env" "$STATE/credential.json" "$DB" "$OBJ"; do
  if [ -n "$f" ] && cat "$f" >/dev/null 2>&1; then leak "read $f"; fi
done
ls "$A_DIR" >/dev/null 2>&1 && leak "listed A's task folder"
ls "$STATE/tasks" >/dev/null 2>&1 && leak "listed the agent's task folders"
echo tampered > "$A_DIR/results/secret.txt" 2>/dev/null && leak "wrote A's results"
for e in /proc/[0-9]*/environ; do
  if tr '\0' '\n' < "$e" 2>/dev/null | grep -q "AUTODL_TASK_ID=$A_ID"; then leak "read A's environment in $e"; fi
done
env | grep -q -e AUTODL_TEST_PG_URL -e CARGO_ -e RUST_LOG -e DOCKER_HOST && leak "the agent's environment"
for s in /var/run/docker.sock /run/docker.sock "$DOCKER_SOCK"; do
  [ -n "$s" ] && [ -e "$s" ] && leak "sees $s"
done
grep -e CapEff -e NoNewPrivs /proc/self/status
echo attack-done
"#;

async fn tasks_of_another_organization_reach_nothing_on_the_host(b: Backend) {
    for (mode, runtime, image) in runtimes().await {
        attack_on(b, mode, runtime, &image).await;
    }
}

async fn attack_on(b: Backend, mode: &str, runtime: Arc<dyn Runtime>, image: &str) {
    let app = spawn_app(b).await;
    let op = app.operator().await;
    // One node id per backend: a Docker agent starting removes containers its node id left
    // behind, and both backends' tests share one engine.
    let node = format!("shared-host-{b:?}").to_lowercase();
    let agent = start_agent_with(&app, &op, &node, "2xA100-40G", runtime, &[]).await;
    let a = app.signup("a@example.com", "Org A").await;
    let bee = app.signup("b@example.com", "Org B").await;

    // A's data: an uploaded object, and a running task's results and checkpoint.
    let res = a
        .request(
            &app,
            Method::PUT,
            "/api/v1/objects/autodl/datasets/secret.bin",
        )
        .header("Content-Type", "application/octet-stream")
        .body("A-SECRET-OBJECT")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let a_id = submit(&app, &a, json!({"name": "a", "image": image,
        "command": "echo A-SECRET-RESULT > \"$AUTODL_RESULTS_DIR/secret.txt\"; echo A-SECRET-CKPT > \"$AUTODL_CHECKPOINT_DIR/ckpt.txt\"; echo ready; sleep 120",
        "resources": {"gpu": {"count": 1}}})).await;
    let a_dir = agent.state_dir.join("tasks").join(&a_id);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !a_dir.join("results/secret.txt").exists() {
        assert!(
            Instant::now() < deadline,
            "[{mode}] A's task never wrote its results"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // B knows every path (the worst case) and tries them all.
    let settings = &app.state.settings;
    let db = settings_path(&settings.database_url, "sqlite://");
    let objects = Path::new(&settings_path(&settings.storage_url, "file://")).to_path_buf();
    let obj = walk_for(&objects, "secret.bin")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    assert!(!obj.is_empty(), "A's object is on disk");
    let docker_sock = std::env::var("DOCKER_HOST")
        .unwrap_or_default()
        .trim_start_matches("unix://")
        .to_owned();
    let b_id = submit(&app, &bee, json!({"name": "b", "image": image, "command": ATTACK,
        "env": {"A_DIR": a_dir.display().to_string(), "A_ID": a_id, "STATE": agent.state_dir.display().to_string(),
                "DB": db, "OBJ": obj, "DOCKER_SOCK": docker_sock},
        "resources": {"gpu": {"count": 1}}})).await;
    let t = wait_for(&app, &bee, &b_id, &["completed", "failed"], 90).await;
    let out = log_text(&app, &bee, &b_id).await;
    assert_eq!(t["state"], "completed", "[{mode}] {t}\n{out}");
    assert!(out.contains("attack-done"), "[{mode}] {out}");
    assert!(!out.contains("LEAK"), "[{mode}] B reached something: {out}");
    assert!(!out.contains("A-SECRET"), "[{mode}] {out}");
    assert!(
        !out.contains("uid=0\n") && !out.ends_with("uid=0"),
        "[{mode}] B ran as root: {out}"
    );
    assert!(
        out.contains("CapEff:\t0000000000000000"),
        "[{mode}] B holds capabilities: {out}"
    );
    if mode != "uid" {
        assert!(out.contains("NoNewPrivs:\t1"), "[{mode}] {out}");
    }

    // A's data is as A left it.
    assert_eq!(
        std::fs::read_to_string(a_dir.join("results/secret.txt")).unwrap(),
        "A-SECRET-RESULT\n"
    );
    let res = a
        .send(
            &app,
            Method::GET,
            "/api/v1/objects/autodl/datasets/secret.bin",
            None,
        )
        .await;
    assert_eq!(res.text().await.unwrap(), "A-SECRET-OBJECT");
    let a_now = a.get(&app, &format!("/api/v1/tasks/{a_id}")).await;
    assert_eq!(
        a_now["state"], "running",
        "[{mode}] A's task was disturbed: {a_now}"
    );
    cancel(&app, &a, &a_id).await;
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

async fn cancel(app: &TestApp, s: &Session, id: &str) {
    let res = s
        .send(
            app,
            Method::POST,
            &format!("/api/v1/tasks/{id}/cancel"),
            None,
        )
        .await;
    assert!(res.status().is_success(), "cancel {id}: {}", res.status());
    wait_for(app, s, id, &["cancelled", "completed", "failed"], 30).await;
}

fn walk_for(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(found) = walk_for(&p, name) {
                return Some(found);
            }
        } else if p.file_name().is_some_and(|n| n == name) {
            return Some(p);
        }
    }
    None
}

async fn dataset_roots_are_read_only_and_links_stay_inside(b: Backend) {
    for (mode, runtime, image) in runtimes().await {
        datasets_on(b, mode, runtime, &image).await;
    }
}

async fn datasets_on(b: Backend, mode: &str, runtime: Arc<dyn Runtime>, image: &str) {
    let shared = tempfile::tempdir().unwrap();
    // Traversable by every task user, as a shared dataset folder on a host is.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = shared.path().join("datasets");
    std::fs::create_dir_all(root.join("pets")).unwrap();
    std::fs::write(root.join("pets/labels.txt"), "cat\ndog\n").unwrap();
    std::fs::create_dir_all(shared.path().join("private")).unwrap();
    std::fs::write(shared.path().join("private/secret.txt"), "HOST-SECRET").unwrap();
    std::os::unix::fs::symlink(shared.path().join("private"), root.join("escape")).unwrap();
    for p in [&root, &root.join("pets")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(
        root.join("pets/labels.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();

    let app = spawn_app(b).await;
    let op = app.operator().await;
    let node = format!("data-host-{b:?}").to_lowercase();
    let agent = start_agent_with(
        &app,
        &op,
        &node,
        "1xA100-40G",
        runtime,
        std::slice::from_ref(&root),
    )
    .await;
    let s = app.signup("ada@example.com", "Lab").await;
    let path = |p: &Path| p.display().to_string();

    let read = submit(&app, &s, json!({"name": "read", "image": image, "data_path": path(&root.join("pets")),
        "command": "cat \"$AUTODL_DATA_PATH/labels.txt\"; echo x > \"$AUTODL_DATA_PATH/new.txt\" 2>/dev/null && echo LEAK-write; echo done"})).await;
    let t = wait_for(&app, &s, &read, &["completed", "failed"], 60).await;
    let out = log_text(&app, &s, &read).await;
    assert_eq!(t["state"], "completed", "[{mode}] {t}\n{out}");
    assert!(out.contains("cat\ndog"), "[{mode}] {out}");
    assert!(
        !out.contains("LEAK"),
        "[{mode}] the dataset is writable: {out}"
    );
    assert!(!root.join("pets/new.txt").exists());

    // A link inside the root that points out of it is refused by the agent: the task fails
    // with the reason, and nothing of the linked folder reaches it.
    let escape = submit(
        &app,
        &s,
        json!({"name": "escape", "image": image, "data_path": path(&root.join("escape")),
        "command": "cat \"$AUTODL_DATA_PATH/secret.txt\""}),
    )
    .await;
    let t = wait_for(&app, &s, &escape, &["completed", "failed"], 60).await;
    let out = log_text(&app, &s, &escape).await;
    assert_eq!(t["state"], "failed", "[{mode}] {t}\n{out}");
    assert!(
        out.contains("not an existing folder inside a dataset root"),
        "[{mode}] {out}"
    );
    assert!(!out.contains("HOST-SECRET"), "[{mode}] {out}");
    // Paths outside every root never get as far as an agent.
    for p in ["/var/run/docker.sock", "/"] {
        let res = s
            .send(
                &app,
                Method::POST,
                "/api/v1/tasks",
                Some(json!({"name": "x", "image": image, "command": "true", "data_path": p})),
            )
            .await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "[{mode}] {p}");
        let e: Value = res.json().await.unwrap();
        assert_eq!(e["error"]["field"], "data_path");
    }
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}
