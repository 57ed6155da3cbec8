//! Faults an operator will meet, each caused for real: an agent killed mid-task, a server
//! killed and down longer than the node timeout. After each, nothing is lost or stuck.

use std::sync::Arc;
use std::time::{Duration, Instant};

use autodl_agent::{IsolationConfig, ProcessRuntime};
use serde_json::json;

use crate::agents::FakeAgent;
use crate::e2e::{agent_binary, log_text, start_agent, start_agent_configured, submit, wait_for};
use crate::helpers::{spawn_app_with, Backend, Session, SmallDisk, TestApp};

crate::on_both_backends!(
    an_agent_killed_mid_task_leaves_nothing_running,
    a_server_killed_mid_run_loses_nothing,
    a_burst_of_output_over_the_body_limit_loses_no_line,
    a_node_clock_minutes_off_loses_nothing_and_is_corrected,
    an_agent_cut_off_stops_its_tasks_before_they_run_elsewhere,
);

/// Alive and not a zombie.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|r| r.trim_start().to_owned()))
        .is_some_and(|rest| !rest.starts_with('Z'))
}

async fn read_pid(path: &std::path::Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if let Ok(p) = s.trim().parse() {
                return p;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A child process killed when the test ends, however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn an_agent_killed_mid_task_leaves_nothing_running(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let token = app.registration_token(&op, "sim-1").await;
    let state = tempfile::tempdir().unwrap();
    let pids = tempfile::tempdir().unwrap();
    // Unisolated tasks (the agent's own user) are the ones only a record of their process
    // group can find again: isolated ones are found by their uid.
    let agent = |token: Option<&str>| {
        let mut cmd = std::process::Command::new(agent_binary());
        cmd.args(["--server", &app.address, "--node-id", "sim-1"])
            .args(["--simulate", "1xA100-40G", "--runtime", "process"])
            .args(["--isolation", "off", "--metrics-listen", "off"])
            .arg("--state-dir")
            .arg(state.path())
            .env("RUST_LOG", "warn");
        if let Some(t) = token {
            cmd.args(["--token", t]);
        }
        Child(cmd.spawn().unwrap())
    };
    let mut first = agent(Some(&token));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !op
        .get(&app, "/api/v1/nodes")
        .await
        .to_string()
        .contains("sim-1")
    {
        assert!(Instant::now() < deadline, "the agent never joined");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Such a node takes only trusted organizations' tasks unless an administrator opens it.
    let res = op
        .send(
            &app,
            reqwest::Method::POST,
            "/api/v1/admin/nodes/sim-1/open-to-all",
            None,
        )
        .await;
    assert_eq!(res.status(), reqwest::StatusCode::NO_CONTENT);
    let s = app.signup("l@example.com", "Lab").await;
    let command = format!(
        "echo $$ > {}/pid-$AUTODL_ATTEMPT; echo on attempt $AUTODL_ATTEMPT; sleep 120",
        pids.path().display()
    );
    let id = submit(
        &app,
        &s,
        json!({"name": "long", "image": "none", "command": command,
        "resources": {"gpu": {"type": "A100", "count": 1}}}),
    )
    .await;
    wait_for(&app, &s, &id, &["running"], 30).await;
    let old = read_pid(&pids.path().join("pid-1")).await;
    // The agent dies without a word; its task does not.
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    assert!(alive(old), "the task outlives its agent");
    let started = Instant::now();
    let _second = agent(None);
    // The restarted agent stops what it left behind, and its first poll tells the server it
    // no longer runs attempt 1: the task runs again, from the queue, at once.
    let new = read_pid(&pids.path().join("pid-2")).await;
    let took = started.elapsed();
    assert!(!alive(old), "the old attempt was stopped");
    assert!(alive(new));
    // With the agent's default 20 s poll: the killed agent's poll is still parked on the
    // server, and the work must wake the new one, not that one.
    assert!(took < Duration::from_secs(10), "back in {took:?}");
    let attempts = s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await;
    assert_eq!(attempts[0]["reason"], "lost", "{attempts}");
    assert_eq!(attempts[1]["node"], "sim-1");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !log_text(&app, &s, &id).await.contains("on attempt 2") {
        assert!(
            Instant::now() < deadline,
            "attempt 2's output never arrived"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = std::process::Command::new("kill")
        .args(["-9", &new.to_string()])
        .status();
}

async fn a_server_killed_mid_run_loses_nothing(b: Backend) {
    // The server stays down for 6 s, less than the agents' fence (half the 30 s node timeout:
    // past it they stop their tasks, see `an_agent_cut_off_stops_its_tasks_before_they_run_elsewhere`).
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let runtime = Arc::new(ProcessRuntime::detect(&IsolationConfig::default()).unwrap());
    let agent = start_agent_configured(&app, &op, "sim-1", "1xA100-40G", runtime, |c| {
        // Polls are short here: a server stopped in-process may leave a held poll hanging
        // where a killed process would have reset the connection.
        c.backoff_initial(Duration::from_secs(2))
            .backoff_max(Duration::from_millis(2500))
            .poll_wait(Duration::from_secs(1))
    })
    .await;
    let s = app.signup("l@example.com", "Lab").await;
    let id = submit(
        &app,
        &s,
        json!({"name": "steady", "image": "none",
        "command": "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo line $i; sleep 1; done",
        "resources": {"gpu": {"type": "A100", "count": 1}}}),
    )
    .await;
    wait_for(&app, &s, &id, &["running"], 30).await;
    app.kill().await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let app = app.restart().await;
    // The agent kept its task running and delivers what it held back: the run completes on
    // its first attempt, with every line, and the node was never judged lost.
    let t = wait_for(&app, &s, &id, &["completed", "failed", "pending"], 60).await;
    let events = s.get(&app, &format!("/api/v1/tasks/{id}/events")).await;
    assert_eq!(t["state"], "completed", "{events}");
    assert_eq!(t["attempts"], 1, "{t}");
    let log = log_text(&app, &s, &id).await;
    for i in 1..=12 {
        assert!(
            log.contains(&format!("line {i}")),
            "line {i} missing: {log}"
        );
    }
    let events = s.get(&app, &format!("/api/v1/tasks/{id}/events")).await;
    assert!(
        !events.to_string().contains("node_lost"),
        "the restarted server judged the node lost: {events}"
    );
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

/// 3,000 lines of 400 characters come out at once: over 1 MiB, four times the server's body
/// limit per batch. Every line is stored, in order (the agent used to lose the refused batches:
/// 2,434 of 3,000 lines).
async fn a_burst_of_output_over_the_body_limit_loses_no_line(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let agent = start_agent(&app, &op, "burst-1", "1xA100-40G").await;
    let s = app.signup("b@example.com", "Lab").await;
    let id = submit(
        &app,
        &s,
        json!({"name": "chatty", "image": "none",
        "command": "i=0; while [ $i -lt 3000 ]; do printf 'line %05d %0389d\\n' $i 0; i=$((i+1)); done",
        "resources": {"gpu": {"type": "A100", "count": 1}}}),
    )
    .await;
    wait_for(&app, &s, &id, &["completed"], 60).await;
    let mut lines = Vec::new();
    let mut after = 0;
    loop {
        let page = s
            .get(
                &app,
                &format!("/api/v1/tasks/{id}/logs?after={after}&limit=5000"),
            )
            .await;
        let got = page["lines"].as_array().unwrap().clone();
        let Some(last) = got.last() else { break };
        after = last["seq"].as_i64().unwrap();
        lines.extend(got.iter().map(|l| l["line"].as_str().unwrap().to_owned()));
    }
    assert_eq!(lines.len(), 3000, "every line is stored once");
    for (i, l) in lines.iter().enumerate() {
        assert!(
            l.starts_with(&format!("line {i:05} ")),
            "line {i} is {l:.20}"
        );
        assert_eq!(l.len(), 400);
    }
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

/// A node whose clock runs two minutes ahead (and one whose clock says 2099): its samples
/// count, its log lines keep their order and land at the server's time, nothing is refused.
async fn a_node_clock_minutes_off_loses_nothing_and_is_corrected(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "skewed-1", "A100-40G", "z1").await;
    let s = app.signup("k@example.com", "Lab").await;
    let (id, attempt, work) = agent
        .placed(
            &app,
            &s,
            json!({"name": "skewed", "image": "none", "command": "true",
                "resources": {"gpu": {"type": "A100", "count": 1}}}),
        )
        .await;
    let gpu = work["gpu_indices"][0].as_u64().unwrap();
    let res = agent
        .call(
            &format!("/api/v1/agent/tasks/{id}/started"),
            json!({"attempt": attempt}),
        )
        .await;
    assert!(res.status().is_success());
    let rfc = |d: time::Duration| {
        (time::OffsetDateTime::now_utc() + d)
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    let ahead = time::Duration::minutes(2);
    let sample = |back_s: i64| {
        json!({"at": rfc(ahead - time::Duration::seconds(back_s)), "gpu_index": gpu,
               "util": 0.74, "mem_used": 1000, "mem_total": 42949672960u64, "task_id": id})
    };
    let before = time::OffsetDateTime::now_utc().unix_timestamp();
    let res = agent
        .call(
            "/api/v1/agent/metrics",
            json!({"sent_at": rfc(ahead), "samples": [sample(3), sample(2), sample(1)]}),
        )
        .await;
    assert_eq!(
        res.status(),
        reqwest::StatusCode::NO_CONTENT,
        "the batch is taken"
    );
    let res = agent
        .call(
            &format!("/api/v1/agent/tasks/{id}/logs"),
            json!({"attempt": attempt, "sent_at": rfc(ahead), "lines": [
                {"at": rfc(ahead - time::Duration::seconds(2)), "stream": "stdout", "line": "first"},
                {"at": rfc(ahead - time::Duration::seconds(1)), "stream": "stdout", "line": "second"}]}),
        )
        .await;
    assert_eq!(res.status(), reqwest::StatusCode::NO_CONTENT);
    // An older agent that does not stamp its batches, with a clock in 2099.
    let res = agent
        .call(
            &format!("/api/v1/agent/tasks/{id}/logs"),
            json!({"attempt": attempt, "lines": [
                {"at": "2099-01-01T00:00:00Z", "stream": "stdout", "line": "third"}]}),
        )
        .await;
    assert_eq!(res.status(), reqwest::StatusCode::NO_CONTENT);
    let after = time::OffsetDateTime::now_utc().unix_timestamp();
    let secs = |v: &serde_json::Value| {
        time::OffsetDateTime::parse(
            v.as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap()
        .unix_timestamp()
    };
    let m = s.get(&app, &format!("/api/v1/tasks/{id}/metrics")).await;
    let samples = m["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 3, "no sample is lost: {m}");
    for x in samples {
        let at = secs(&x["at"]);
        assert!(
            at >= before - 5 && at <= after,
            "sample time is on the server's clock: {x}"
        );
    }
    let logs = s.get(&app, &format!("/api/v1/tasks/{id}/logs")).await;
    let lines = logs["lines"].as_array().unwrap();
    let text: Vec<&str> = lines.iter().map(|l| l["line"].as_str().unwrap()).collect();
    assert_eq!(text, ["first", "second", "third"]);
    for l in lines {
        let at = secs(&l["at"]);
        assert!(
            at >= before - 5 && at <= after,
            "line time is on the server's clock: {l}"
        );
    }
    assert!(secs(&lines[0]["at"]) < secs(&lines[1]["at"]) || lines[0]["at"] == lines[1]["at"]);
}

/// The database's disk fills up: writes answer 503 with a clear error and `/healthz` says the
/// store cannot write; once space is freed, the server writes again by itself (it used to stay
/// broken until restarted), and nothing stored before is lost.
#[tokio::test]
async fn a_full_database_disk_is_reported_and_recovered_from() {
    let Some(disk) = SmallDisk::mount("8m") else {
        crate::helpers::skip("mounting a small filesystem needs root (CI runs as root)");
        return;
    };
    let url = format!("sqlite://{}/autodl.db", disk.path.display());
    let app = spawn_app_with(Backend::Sqlite, |s| s.database_url = url).await;
    let s = app.signup("f@example.com", "Lab").await;
    let task = |i: usize| {
        json!({"name": format!("t{i}"), "image": "none", "command": "true",
               "env": {"PAD": "x".repeat(1024)},
               "resources": {"gpu": {"type": "A100", "count": 1}}})
    };
    let mut stored = Vec::new();
    for i in 0..3 {
        stored.push(submit(&app, &s, task(i)).await);
    }
    let health = |app: &crate::helpers::TestApp| {
        let url = app.url("/healthz");
        async move {
            let res = reqwest::get(url).await.unwrap();
            let code = res.status();
            (code, res.json::<serde_json::Value>().await.unwrap())
        }
    };
    assert_eq!(health(&app).await.0, reqwest::StatusCode::OK);

    let filler = disk.fill();
    let mut refused = None;
    for i in 3..3000 {
        let res = s
            .send(&app, reqwest::Method::POST, "/api/v1/tasks", Some(task(i)))
            .await;
        if res.status() == reqwest::StatusCode::CREATED {
            stored.push(
                res.json::<serde_json::Value>().await.unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
            continue;
        }
        refused = Some((res.status(), res.json::<serde_json::Value>().await.unwrap()));
        break;
    }
    let (code, body) = refused.expect("a full disk refuses writes");
    assert_eq!(code, reqwest::StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "database_unavailable", "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("full"),
        "{body}"
    );
    let (code, body) = health(&app).await;
    assert_eq!(code, reqwest::StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["writable"], false);

    std::fs::remove_file(filler).unwrap();
    let freed = Instant::now();
    loop {
        let (code, _) = health(&app).await;
        let res = s
            .send(
                &app,
                reqwest::Method::POST,
                "/api/v1/tasks",
                Some(task(999)),
            )
            .await;
        if code == reqwest::StatusCode::OK && res.status() == reqwest::StatusCode::CREATED {
            break;
        }
        assert!(
            freed.elapsed() < Duration::from_secs(10),
            "still broken after the disk has room again: {}",
            res.text().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_kept(&app, &s, &stored).await;
    app.kill().await;
}

/// `chattr`: root may write any file it can open, but not an immutable one.
fn immutable(path: &std::path::Path, on: bool) -> bool {
    std::process::Command::new("chattr")
        .arg(if on { "+i" } else { "-i" })
        .arg(path)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A task that needs nothing but its record.
fn small_task(i: usize) -> serde_json::Value {
    json!({"name": format!("t{i}"), "image": "none", "command": "true",
           "resources": {"gpu": {"type": "A100", "count": 1}}})
}

/// Makes a file writable again when dropped.
struct Restore(std::path::PathBuf);

impl Drop for Restore {
    fn drop(&mut self) {
        immutable(&self.0, false);
    }
}

/// A server on SQLite on a small disk of its own, with three tasks stored, whose database file
/// is then made immutable (until the guard is dropped); `None`, said skipped, where this
/// machine cannot do that.
/// With `warm`, reads at once before the fault, so the pool holds several connections opened
/// before it (the scheduler may hold one at any moment).
async fn immutable_database(
    email: &str,
    warm: bool,
) -> Option<(SmallDisk, TestApp, Session, Vec<String>, Restore)> {
    let Some(disk) = SmallDisk::mount("64m") else {
        crate::helpers::skip("mounting a small filesystem needs root (CI runs as root)");
        return None;
    };
    let db = disk.path.join("autodl.db");
    let url = format!("sqlite://{}", db.display());
    let app = spawn_app_with(Backend::Sqlite, |s| {
        s.database_url = url;
        s.db_max_connections = 8;
    })
    .await;
    let s = app.signup(email, "Lab").await;
    let mut stored = Vec::new();
    for i in 0..3 {
        stored.push(submit(&app, &s, small_task(i)).await);
    }
    if warm {
        futures_util::future::join_all(
            (0..6).map(|_| s.send(&app, reqwest::Method::GET, "/api/v1/tasks?limit=200", None)),
        )
        .await;
    }
    if !immutable(&db, true) {
        crate::helpers::skip("this filesystem cannot make a file immutable");
        return None;
    }
    Some((disk, app, s, stored, Restore(db)))
}

/// The database file cannot be opened for writing for a while (made read-only, or immutable:
/// root ignores file modes). Connections opened meanwhile are read-only for life: writes
/// answer 503 with a clear error (never 500), `/healthz` says the store cannot write, and once
/// the file is writable again the server writes by itself (it used to answer "readonly
/// database" until restarted); nothing stored before is lost.
#[tokio::test]
async fn a_read_only_database_file_is_reported_and_recovered_from() {
    let Some((_disk, app, s, mut stored, guard)) =
        immutable_database("ro@example.com", false).await
    else {
        return;
    };
    let task = small_task;
    // Eight submissions at once, so the pool opens connections.
    let burst = |from: usize| {
        futures_util::future::join_all((0..8).map(|i| {
            s.send(
                &app,
                reqwest::Method::POST,
                "/api/v1/tasks",
                Some(task(from + i)),
            )
        }))
    };

    // Submissions in parallel make the pool open connections, which now open read-only (or
    // reuse a descriptor SQLite kept open for writing, which still writes): every answer is a
    // success or a clear 503, never a 500.
    let (mut refused, mut unhealthy) = (None, None);
    let started = Instant::now();
    while (refused.is_none() || unhealthy.is_none()) && started.elapsed() < Duration::from_secs(20)
    {
        let answers = burst(100).await;
        for res in answers {
            let code = res.status();
            let body: serde_json::Value = res.json().await.unwrap();
            match code {
                reqwest::StatusCode::CREATED => {
                    stored.push(body["id"].as_str().unwrap().to_owned())
                }
                _ => {
                    assert_eq!(code, reqwest::StatusCode::SERVICE_UNAVAILABLE, "{body}");
                    assert_eq!(body["error"]["code"], "database_unavailable", "{body}");
                    refused = Some(body);
                }
            }
        }
        let health = reqwest::get(app.url("/healthz")).await.unwrap();
        let code = health.status();
        let health: serde_json::Value = health.json().await.unwrap();
        assert_eq!(
            health["writable"],
            code == reqwest::StatusCode::OK,
            "{health}"
        );
        if code != reqwest::StatusCode::OK {
            unhealthy = Some(health);
        }
    }
    let refused = refused.expect("a read-only database refuses writes");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("read-only"),
        "{refused}"
    );
    let unhealthy = unhealthy.expect("/healthz tells that the database cannot write");
    assert!(
        unhealthy["problem"]
            .as_str()
            .unwrap()
            .contains("cannot write"),
        "{unhealthy}"
    );

    drop(guard);
    // Recovered: health says so and every connection the pool hands out writes again (a
    // connection opened read-only during the fault would keep refusing).
    let fixed = Instant::now();
    let mut clean_rounds = 0;
    while clean_rounds < 5 {
        let healthy = reqwest::get(app.url("/healthz")).await.unwrap().status();
        let answers = burst(900).await;
        let mut failed = None;
        for res in answers {
            if res.status() != reqwest::StatusCode::CREATED {
                failed = Some(res.text().await.unwrap());
            }
        }
        match failed {
            None if healthy == reqwest::StatusCode::OK => clean_rounds += 1,
            _ => clean_rounds = 0,
        }
        assert!(
            fixed.elapsed() < Duration::from_secs(10),
            "still broken after the file is writable again: {failed:?}"
        );
    }
    eprintln!(
        "recovered {} ms after the file became writable",
        fixed.elapsed().as_millis()
    );
    assert_kept(&app, &s, &stored).await;
    app.kill().await;
}

/// The database file becomes unwritable while the server runs, as an operator's `chattr +i` or
/// a remount does from outside: connections already open keep writing (their descriptors were
/// opened for writing), and only the connections opened afterwards cannot. Writes through the
/// open ones go on and are kept; once the pool opens new ones, writes answer a clear 503 (never
/// 500); when the file is writable again the server writes by itself; and after a restart
/// every write it acknowledged, before, during and after, is there.
#[tokio::test]
async fn a_database_file_unwritable_for_new_connections_only_loses_nothing() {
    let Some((_disk, app, s, mut stored, guard)) = immutable_database("nc@example.com", true).await
    else {
        return;
    };
    let task = small_task;
    // Every answer is a success (kept) or a clear 503.
    let mut answered = |res_code: reqwest::StatusCode, body: serde_json::Value| -> bool {
        if res_code == reqwest::StatusCode::CREATED {
            stored.push(body["id"].as_str().unwrap().to_owned());
            return true;
        }
        assert_eq!(res_code, reqwest::StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(body["error"]["code"], "database_unavailable", "{body}");
        false
    };
    // One at a time: the pool hands out the connections it has, opened before the fault.
    let res = s
        .send(&app, reqwest::Method::POST, "/api/v1/tasks", Some(task(10)))
        .await;
    let code = res.status();
    assert!(
        answered(code, res.json().await.unwrap()),
        "a connection opened before the fault no longer writes"
    );
    // Many at once: the pool opens connections, which cannot write.
    let mut refused = 0;
    for round in 0..10 {
        let answers = futures_util::future::join_all((0..8).map(|i| {
            s.send(
                &app,
                reqwest::Method::POST,
                "/api/v1/tasks",
                Some(task(100 + round * 8 + i)),
            )
        }))
        .await;
        for res in answers {
            let code = res.status();
            if !answered(code, res.json().await.unwrap()) {
                refused += 1;
            }
        }
    }
    eprintln!("{refused} of 80 writes refused while new connections could not write");
    drop(guard);
    let fixed = Instant::now();
    loop {
        let res = s
            .send(
                &app,
                reqwest::Method::POST,
                "/api/v1/tasks",
                Some(task(999)),
            )
            .await;
        let code = res.status();
        if answered(code, res.json().await.unwrap()) {
            break;
        }
        assert!(
            fixed.elapsed() < Duration::from_secs(10),
            "still refusing writes after the file is writable again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Restarted on the same file: every acknowledged write is there.
    app.kill().await;
    let app = app.restart().await;
    assert_kept(&app, &s, &stored).await;
    app.kill().await;
}

/// Every task stored before a fault is still there after it.
async fn assert_kept(app: &crate::helpers::TestApp, s: &crate::helpers::Session, ids: &[String]) {
    for id in ids {
        let t = s.get(app, &format!("/api/v1/tasks/{id}")).await;
        assert_eq!(
            t["id"],
            id.as_str(),
            "task {id} stored before the fault is kept"
        );
    }
}

/// A server stopped for 45 s (SIGSTOP: a debugger, a cgroup freezer, a VM paused) with the
/// production defaults (30 s node timeout, agents' 20 s polls): on waking it heard nothing for
/// longer than the node timeout, but that silence was its own. No node is judged lost.
#[tokio::test]
async fn a_paused_server_judges_no_node_lost() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let env = [
        (
            "AUTODL_DATABASE_URL",
            format!("sqlite://{}/a.db", dir.path().display()),
        ),
        ("AUTODL_SITE_ROOT", dir.path().display().to_string()),
        ("AUTODL_LISTEN", format!("127.0.0.1:{port}")),
        (
            "AUTODL_STORAGE_URL",
            format!("file://{}/objects", dir.path().display()),
        ),
        ("AUTODL_JWT_SECRET", format!("pause-{}", std::process::id())),
        ("RUST_LOG", "warn".to_owned()),
    ];
    let server_bin = env!("CARGO_BIN_EXE_autodl-server");
    let (email, password) = ("ops@example.com", "Operat0r-secret!");
    let made = std::process::Command::new(server_bin)
        .args([
            "admin",
            "create-admin",
            "--email",
            email,
            "--password",
            password,
        ])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let server = Child(
        std::process::Command::new(server_bin)
            .arg("serve")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    // A fresh connection each call: the server drops idle ones when it wakes.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while http
        .get(format!("{base}/healthz"))
        .send()
        .await
        .map_or(true, |r| !r.status().is_success())
    {
        assert!(Instant::now() < deadline, "the server never started");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let call = |token: Option<String>,
                method: reqwest::Method,
                path: &str,
                body: Option<serde_json::Value>| {
        let mut req = http.request(method, format!("{base}{path}"));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move {
            let res = req.send().await.unwrap();
            let status = res.status();
            let text = res.text().await.unwrap();
            assert!(status.is_success(), "{status}: {text}");
            serde_json::from_str::<serde_json::Value>(&text).unwrap_or_default()
        }
    };
    use reqwest::Method;
    let op = call(
        None,
        Method::POST,
        "/api/v1/auth/login",
        Some(json!({"email": email, "password": password})),
    )
    .await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let reg = call(
        Some(op.clone()),
        Method::POST,
        "/api/v1/admin/registration-tokens",
        Some(json!({"node_id": "paused-1"})),
    )
    .await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let state = tempfile::tempdir().unwrap();
    let _agent = Child(
        std::process::Command::new(agent_binary())
            .args(["--server", &base, "--node-id", "paused-1", "--token", &reg])
            .args(["--simulate", "1xA100-40G", "--runtime", "process"])
            .args(["--isolation", "off", "--metrics-listen", "off"])
            .arg("--state-dir")
            .arg(state.path())
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes = call(Some(op.clone()), Method::GET, "/api/v1/nodes", None).await;
        if nodes.to_string().contains("paused-1") {
            break;
        }
        assert!(Instant::now() < deadline, "the agent never joined");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    call(
        Some(op.clone()),
        Method::POST,
        "/api/v1/admin/nodes/paused-1/open-to-all",
        None,
    )
    .await;
    let user = call(
        None,
        Method::POST,
        "/api/v1/auth/signup",
        Some(
            json!({"email": "ada@example.com", "password": "Resear-cher-2024!",
                    "tenant_name": "Lab"}),
        ),
    )
    .await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let id = call(
        Some(user.clone()),
        Method::POST,
        "/api/v1/tasks",
        Some(json!({"name": "long", "image": "none",
                    "command": "echo on attempt $AUTODL_ATTEMPT; sleep 600",
                    "resources": {"gpu": {"type": "A100", "count": 1}}})),
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let task = |user: String| {
        call(
            Some(user),
            Method::GET,
            &format!("/api/v1/tasks/{id}"),
            None,
        )
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while task(user.clone()).await["state"] != "running" {
        assert!(Instant::now() < deadline, "the task never started");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pid = server.0.id().to_string();
    let signal = |sig: &str| {
        let done = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap();
        assert!(done.success());
    };
    signal("-STOP");
    tokio::time::sleep(Duration::from_secs(45)).await;
    signal("-CONT");
    // Past another node timeout after the wake-up: the node was never judged lost. (Its agent,
    // which cannot tell a paused server from a partition, stopped the task at its fence and
    // it runs again, from the queue, on the same node.)
    let until = Instant::now() + Duration::from_secs(40);
    while Instant::now() < until {
        let nodes = call(Some(op.clone()), Method::GET, "/api/v1/nodes", None).await;
        assert_eq!(
            nodes[0]["schedulable"], true,
            "judged lost for the server's own pause: {nodes}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let events = call(
        Some(user.clone()),
        Method::GET,
        &format!("/api/v1/tasks/{id}/events"),
        None,
    )
    .await;
    assert!(
        !events.to_string().contains("stopped answering"),
        "{events}"
    );
    let t = task(user.clone()).await;
    assert_eq!(t["state"], "running", "{t}\n{events}");
    // The agent stops its task when told to: nothing is left behind.
    call(
        Some(user.clone()),
        Method::POST,
        &format!("/api/v1/tasks/{id}/cancel"),
        None,
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while task(user.clone()).await["state"] != "cancelled" {
        assert!(Instant::now() < deadline, "the task was never cancelled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// A TCP relay to the server that can be cut, as a network partition cuts one node off.
struct Link {
    addr: String,
    cut: autodl_agent::CancellationToken,
}

impl Link {
    async fn to(server: &str) -> Link {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let target = server.trim_start_matches("http://").to_owned();
        let cut = autodl_agent::CancellationToken::new();
        let stop = cut.clone();
        tokio::spawn(async move {
            loop {
                let (mut inbound, _) = tokio::select! {
                    _ = stop.cancelled() => return,
                    a = listener.accept() => match a { Ok(a) => a, Err(_) => return },
                };
                let (target, stop) = (target.clone(), stop.clone());
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    }
                });
            }
        });
        Link { addr, cut }
    }
}

/// One node is cut off from the server (a partition) while its task runs, with the production
/// defaults (30 s node timeout). Past half that silence its agent stops the task (SIGTERM, a
/// third of the timeout to checkpoint); past the timeout the server runs it on another node.
/// The two runs never overlap: the first ended before the second began.
async fn an_agent_cut_off_stops_its_tasks_before_they_run_elsewhere(b: Backend) {
    let app = spawn_app_with(b, |_| {}).await;
    let op = app.operator().await;
    let link = Link::to(&app.address).await;
    let server = link.addr.clone();
    let trusted = || Arc::new(ProcessRuntime::trusted());
    let cut_off = start_agent_configured(&app, &op, "cut-1", "1xA100-40G", trusted(), |mut c| {
        c.server_url = server.clone();
        c
    })
    .await;
    crate::isolation::share(&app, &op, "cut-1").await;
    let s = app.signup("cut@example.com", "Lab").await;
    let marks = tempfile::tempdir().unwrap();
    let file = marks.path().join("runs");
    let command = format!(
        "trap 'echo $AUTODL_ATTEMPT end $(date +%s%N) >> {f}; exit 0' TERM; \
         echo $AUTODL_ATTEMPT start $(date +%s%N) >> {f}; while true; do sleep 0.1; done",
        f = file.display()
    );
    let id = submit(
        &app,
        &s,
        json!({"name": "partitioned", "image": "none", "command": command,
               "resources": {"gpu": {"type": "A100", "count": 1}}}),
    )
    .await;
    wait_for(&app, &s, &id, &["running"], 30).await;
    // A second node to run it once the first is judged lost.
    let other = start_agent_configured(&app, &op, "cut-2", "1xA100-40G", trusted(), |c| c).await;
    crate::isolation::share(&app, &op, "cut-2").await;
    let cut_at = Instant::now();
    link.cut.cancel();
    let deadline = Instant::now() + Duration::from_secs(90);
    let runs = loop {
        let runs = std::fs::read_to_string(&file).unwrap_or_default();
        if runs.contains("2 start") {
            break runs;
        }
        assert!(Instant::now() < deadline, "never ran elsewhere: {runs}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let at = |what: &str| -> u128 {
        runs.lines()
            .find_map(|l| l.strip_prefix(what))
            .unwrap_or_else(|| panic!("no {what:?} in {runs}"))
            .trim()
            .parse()
            .unwrap()
    };
    let (first_end, second_start) = (at("1 end"), at("2 start"));
    assert!(
        first_end < second_start,
        "the two runs overlapped by {} ms: {runs}",
        (first_end - second_start) / 1_000_000
    );
    eprintln!(
        "cut off, the second run started {:.1} s later, {:.1} s after the first ended",
        cut_at.elapsed().as_secs_f64(),
        (second_start - first_end) as f64 / 1e9
    );
    let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
    assert_eq!(t["attempts"], 2, "{t}");
    for a in [cut_off, other] {
        a.shutdown.cancel();
        let _ = a.handle.await;
    }
}
