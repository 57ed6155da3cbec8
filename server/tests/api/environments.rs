//! A task's environment (`requirements`, `setup`): built once per node as the task's user in
//! its sandbox or container, shown read-only at `$AUTODL_ENV_DIR`, reused by the next task
//! with the same environment, never by another organization's, and not kept when its build
//! fails. On every runtime the platform offers for shared use.

use std::time::Duration;

use serde_json::{json, Value};

use crate::code::{tar_gz, upload};
use crate::e2e::{log_text, start_agent_with, submit, wait_for};
use crate::helpers::{spawn_app, Backend, Session, TestApp};
use crate::isolation::{runtimes, share};

/// The environment's store plays no part: one backend suffices.
#[tokio::test]
async fn an_environment_is_built_once_per_organization_and_reused() {
    for (mode, runtime, image) in runtimes().await {
        environments_on(mode, runtime, &image).await;
    }
}

/// A wheel of a package `hello_env`, made with the host's Python (a wheel is a zip file).
fn wheel() -> Vec<u8> {
    let python = std::env::var("AUTODL_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(python)
        .args([
            "-c",
            r#"
import io, sys, zipfile
b = io.BytesIO()
with zipfile.ZipFile(b, "w") as z:
    z.writestr("hello_env/__init__.py", "GREETING = 'hello from the environment'\n")
    z.writestr("hello_env-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: hello-env\nVersion: 0.1\n")
    z.writestr("hello_env-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr("hello_env-0.1.dist-info/RECORD", "")
sys.stdout.buffer.write(b.getvalue())
"#,
        ])
        .output()
        .expect("python3");
    assert!(out.status.success(), "{out:?}");
    out.stdout
}

/// Runs a task to its end: what it ended as, its log with its environment steps (from its
/// timeline) after it, and how long it took from submission.
async fn run(app: &TestApp, s: &Session, body: Value) -> (Value, String, f64) {
    let t0 = std::time::Instant::now();
    let id = submit(app, s, body).await;
    let t = wait_for(app, s, &id, &["completed", "failed", "cancelled"], 180).await;
    let secs = t0.elapsed().as_secs_f64();
    let events = s.get(app, &format!("/api/v1/tasks/{id}/events")).await;
    let steps: Vec<String> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "environment")
        .map(|e| format!("EVENT {}", e["message"].as_str().unwrap()))
        .collect();
    (
        t,
        format!("{}\n{}", log_text(app, s, &id).await, steps.join("\n")),
        secs,
    )
}

async fn environments_on(
    mode: &str,
    runtime: std::sync::Arc<dyn autodl_agent::Runtime>,
    image: &str,
) {
    let app = spawn_app(Backend::Sqlite).await;
    let op = app.operator().await;
    let node = format!("env-{mode}");
    let agent = start_agent_with(&app, &op, &node, "1xA100-40G", runtime, &[]).await;
    share(&app, &op, &node).await;
    let a = app.signup("ada@example.com", "Alpha").await;
    let b = app.signup("bob@example.com", "Beta").await;

    // Docker's test image has no Python: its environment is what setup puts in bin/.
    let python = mode != "docker";
    let bundle = tar_gz(&[
        (
            "requirements.txt",
            0o644,
            b"--no-index\n./wheels/hello_env-0.1-py3-none-any.whl\n",
        ),
        ("wheels/hello_env-0.1-py3-none-any.whl", 0o644, &wheel()),
    ]);
    let mut codes = Vec::new();
    for s in [&a, &b] {
        let up: Value = upload(&app, s, bundle.clone()).await.json().await.unwrap();
        codes.push(up["id"].as_str().unwrap().to_owned());
    }
    let setup = json!([
        "echo setup-ran",
        "printf '#!/bin/sh\\necho tool-ok\\n' > \"$AUTODL_ENV_DIR/bin/envtool\"",
        "chmod 755 \"$AUTODL_ENV_DIR/bin/envtool\"",
    ]);
    let command = format!(
        "envtool; {} (echo x > \"$AUTODL_ENV_DIR/tampered\") 2>/dev/null && echo ENV-WRITABLE; echo done",
        if python {
            "python -c 'import hello_env, sys; print(hello_env.GREETING, sys.prefix)';"
        } else {
            ""
        }
    );
    let spec = |code: &str| {
        let mut spec = json!({"name": "env", "image": image, "code": code, "command": command,
            "setup": setup, "resources": {"gpu": {"count": 1}}});
        if python {
            spec["requirements"] = json!("requirements.txt");
        }
        spec
    };

    // The first task builds it: the requirements installed, the setup run, both in the log.
    let (t, first, built_s) = run(&app, &a, spec(&codes[0])).await;
    assert_eq!(t["state"], "completed", "{mode}: {t}\n{first}");
    assert!(first.contains("building: "), "{mode}: {first}");
    assert!(first.contains("built in"), "{mode}: {first}");
    assert!(
        first.contains("EVENT environment ") && first.contains(" built in "),
        "{mode}: each step is in the timeline: {first}"
    );
    assert!(
        first.contains("setup-ran") && first.contains("tool-ok"),
        "{mode}: {first}"
    );
    if python {
        assert!(
            first.contains("pip install -r requirements.txt"),
            "{mode}: {first}"
        );
        assert!(
            first.contains("hello from the environment /autodl/env")
                || (mode == "uid" && first.contains("hello from the environment /")),
            "{mode}: the task runs in its virtualenv: {first}"
        );
    }
    assert!(
        !first.contains("ENV-WRITABLE"),
        "{mode}: a task changes no environment: {first}"
    );

    // The next task of the organization reuses it: no setup, the same packages.
    let (t, second, reused_s) = run(&app, &a, spec(&codes[0])).await;
    assert_eq!(t["state"], "completed", "{mode}: {t}\n{second}");
    assert!(second.contains("reused"), "{mode}: {second}");
    assert!(
        second.contains("EVENT environment ") && second.contains(" reused"),
        "{mode}: {second}"
    );
    assert!(
        !second.contains("setup-ran"),
        "{mode}: built once: {second}"
    );
    assert!(second.contains("tool-ok"), "{mode}: {second}");
    if python {
        assert!(
            second.contains("hello from the environment"),
            "{mode}: {second}"
        );
    }
    assert!(!second.contains("ENV-WRITABLE"), "{mode}: {second}");
    eprintln!("{mode}: first task (builds) {built_s:.1} s, second (reuses) {reused_s:.1} s");

    // Another organization's task with the very same request gets an environment of its own.
    let (t, other, _) = run(&app, &b, spec(&codes[1])).await;
    assert_eq!(t["state"], "completed", "{mode}: {t}\n{other}");
    assert!(
        other.contains("setup-ran") && !other.contains("reused"),
        "{mode}: {other}"
    );

    // A setup that fails fails the attempt, saying so, and leaves nothing to reuse.
    let mut broken = spec(&codes[0]);
    broken["setup"] = json!("echo about-to-fail; exit 7");
    for _ in 0..2 {
        let (t, log, _) = run(&app, &a, broken.clone()).await;
        assert_eq!(t["state"], "failed", "{mode}: {t}\n{log}");
        assert!(log.contains("about-to-fail"), "{mode}: {log}");
        assert!(
            log.contains("the environment could not be built: exit code 7"),
            "{mode}: {log}"
        );
        assert!(
            log.contains("EVENT the environment could not be built: exit code 7"),
            "{mode}: {log}"
        );
        assert!(
            !log.contains("reused"),
            "{mode}: a failed build is not kept: {log}"
        );
    }
    // An environment others could change, or with a set-id program, is not kept.
    let mut open = spec(&codes[0]);
    open["setup"] = json!("touch \"$AUTODL_ENV_DIR/open\" && chmod 666 \"$AUTODL_ENV_DIR/open\"");
    let (t, log, _) = run(&app, &a, open).await;
    assert_eq!(t["state"], "failed", "{mode}: {t}\n{log}");
    assert!(
        log.contains("open in the environment is writable by others or set-id"),
        "{mode}: {log}"
    );
    agent.shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), agent.handle).await;
}
