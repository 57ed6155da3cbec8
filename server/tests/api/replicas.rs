//! Three servers on one PostgreSQL database, two of them real processes: any of them takes
//! submissions and agent polls, a placement made by the leader reaches an agent polling another
//! server within a second (LISTEN/NOTIFY), explanations are the same everywhere, and killing
//! the leader (SIGKILL) hands scheduling to another within ten seconds; no task is placed twice.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::agents::FakeAgent;
use crate::helpers::{spawn_app_with, Backend, ServerProcess as Replica, Session, TestApp};

/// Waits until exactly one of `replicas` leads; returns its index.
async fn leader_of(replicas: &[&Replica], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let mut leaders = Vec::new();
        for (i, r) in replicas.iter().enumerate() {
            if r.role().await.as_deref() == Some("leader") {
                leaders.push(i);
            }
        }
        if leaders.len() == 1 {
            return leaders[0];
        }
        assert!(leaders.len() < 2, "two servers lead at once");
        assert!(Instant::now() < deadline, "no server leads");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Submits on `app` and long-polls `agent` until the task arrives; returns the task id and
/// the time from the submission's answer to the assignment.
async fn submit_and_receive(
    app: &TestApp,
    s: &Session,
    agent: &FakeAgent,
    name: &str,
    finish: bool,
) -> (String, Duration) {
    let poller = {
        let agent = FakeAgent {
            base: agent.base.clone(),
            credential: agent.credential.clone(),
            http: agent.http.clone(),
        };
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let work = agent.poll(&[], 20).await;
                let got = work["assignments"].as_array().cloned().unwrap_or_default();
                if !got.is_empty() {
                    return (got, Instant::now());
                }
                assert!(Instant::now() < deadline, "nothing arrived");
            }
        })
    };
    // The poll is waiting before the task exists.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let res = s
        .send(
            app,
            Method::POST,
            "/api/v1/tasks",
            Some(json!({"name": name, "image": "none", "command": "true",
                "resources": {"gpu": {"type": "A100", "count": 1}}})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let submitted = Instant::now();
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (got, at) = poller.await.unwrap();
    assert_eq!(got.len(), 1, "one assignment: {got:?}");
    assert_eq!(got[0]["task_id"], id.as_str());
    // It ran (and finished, freeing its GPU).
    let attempt = got[0]["attempt"].as_u64().unwrap();
    let mut reports = vec![("started", json!({"attempt": attempt}))];
    if finish {
        reports.push((
            "finished",
            json!({"attempt": attempt, "exit_code": 0, "reason": "success"}),
        ));
    }
    for (what, body) in reports {
        let r = agent
            .call(&format!("/api/v1/agent/tasks/{id}/{what}"), body)
            .await;
        assert!(r.status().is_success(), "{what}: {}", r.status());
    }
    (id, at.saturating_duration_since(submitted))
}

#[tokio::test]
async fn replicas_share_the_work_and_survive_the_leader() {
    // An in-process server that never schedules: it takes the submissions.
    let app = spawn_app_with(Backend::Postgres, |s| s.run_scheduler = false).await;
    let op = app.operator().await;
    let s = app.signup("r@example.com", "Lab").await;
    let mut reps = [Replica::start(&app), Replica::start(&app)];
    let first = leader_of(&[&reps[0], &reps[1]], Duration::from_secs(30)).await;
    let follower = reps[1 - first].address.clone();
    assert!(
        !app.state.scheduler.is_leader(),
        "the in-process server does not schedule"
    );
    // The agent joins through one server and polls another that does not lead.
    let mut agent = FakeAgent::join(&app, &op, "rep-1", "A100-40G", "z1").await;
    agent.base = follower.clone();

    // Explanations come from the store: the follower and the in-process server agree.
    let mut placed = Vec::new();
    let mut latencies = Vec::new();
    for i in 0..5 {
        let (id, took) = submit_and_receive(&app, &s, &agent, &format!("t{i}"), true).await;
        placed.push(id);
        latencies.push(took);
    }
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    eprintln!("submission on one server to assignment on another: {latencies:?}");
    assert!(
        median < Duration::from_secs(1),
        "a placement reaches an agent polling another server within a second: {latencies:?}"
    );

    // A task that cannot fit beside a running one waits, and every server says why, the same
    // way. (No poll meanwhile: the agent's next poll would not list the blocker.)
    let (blocker, _) = submit_and_receive(&app, &s, &agent, "blocker", false).await;
    let res = s
        .send(
            &app,
            Method::POST,
            "/api/v1/tasks",
            Some(
                json!({"name": "too-big", "image": "none", "command": "true",
                "resources": {"gpu": {"type": "A100", "count": 4}}}),
            ),
        )
        .await;
    let waiting_id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    let explained = loop {
        let t = s.get(&app, &format!("/api/v1/tasks/{waiting_id}")).await;
        if t["waiting"]["reason"].is_string() {
            break t["waiting"].clone();
        }
        assert!(Instant::now() < deadline, "never explained: {t}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let via_follower: Value = s
        .client
        .get(format!("{follower}/api/v1/tasks/{waiting_id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(via_follower["waiting"]["message"], explained["message"]);
    for id in [&waiting_id, &blocker] {
        let res = s
            .send(
                &app,
                Method::POST,
                &format!("/api/v1/tasks/{id}/cancel"),
                None,
            )
            .await;
        assert!(res.status().is_success());
    }

    // The leader's lock connection is cut (split brain, before fencing: both scheduled and a
    // task was charged twice). One server leads again, never two; tasks are placed once.
    let admin = sqlx::PgPool::connect(&app.state.settings.database_url)
        .await
        .unwrap();
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .execute(&admin)
    .await
    .unwrap();
    admin.close().await;
    for i in 0..3 {
        leader_of(&[&reps[0], &reps[1]], Duration::from_secs(10)).await;
        let (id, _) = submit_and_receive(&app, &s, &agent, &format!("cut{i}"), true).await;
        placed.push(id);
    }

    // The leader dies without a word; the other takes over.
    let leading = leader_of(&[&reps[0], &reps[1]], Duration::from_secs(10)).await;
    agent.base = reps[1 - leading].address.clone();
    reps[leading].kill();
    let killed = Instant::now();
    leader_of(&[&reps[1 - leading]], Duration::from_secs(10)).await;
    let (id, _) = submit_and_receive(&app, &s, &agent, "after", true).await;
    let failover = killed.elapsed();
    eprintln!("leader killed to the next task placed by the new leader: {failover:?}");
    assert!(
        failover < Duration::from_secs(10),
        "failover took {failover:?}"
    );
    placed.push(id);

    // None was placed twice.
    for id in &placed {
        let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
        assert_eq!(t["attempts"], 1, "{t}");
        assert_eq!(t["state"], "completed", "{t}");
    }
}

/// `/healthz` of one server, or `None` when it does not answer within a second (frozen).
async fn health_of(r: &Replica) -> Option<Value> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let res = http
        .get(format!("{}/healthz", r.address))
        .send()
        .await
        .ok()?;
    res.json().await.ok()
}

/// The leader is frozen (SIGSTOP for 20 s: a debugger, a paused VM, a cgroup freezer) while
/// PostgreSQL still sees its lock connection: it used to lead on, placing nothing, for as long
/// as it was frozen. Its lease runs out, the follower ends its sessions and leads: a task
/// submitted meanwhile is placed within seconds. Woken, the old leader finds its lock gone and
/// follows (never two leaders), and no task is placed twice.
#[tokio::test]
async fn a_frozen_leader_is_replaced_within_seconds() {
    let app = spawn_app_with(Backend::Postgres, |s| s.run_scheduler = false).await;
    let op = app.operator().await;
    let s = app.signup("frozen@example.com", "Lab").await;
    let reps = [Replica::start(&app), Replica::start(&app)];
    let first = leader_of(&[&reps[0], &reps[1]], Duration::from_secs(30)).await;
    let other = 1 - first;
    let mut agent = FakeAgent::join(&app, &op, "rep-1", "A100-40G", "z1").await;
    agent.base = reps[other].address.clone();
    let mut placed = vec![submit_and_receive(&app, &s, &agent, "before", true).await.0];
    let health = health_of(&reps[other]).await.unwrap();
    assert!(health["last_cycle_s"].as_f64().unwrap() < 10.0, "{health}");
    assert_eq!(health["scheduler_stalled"], false, "{health}");

    reps[first].signal("STOP");
    let frozen = Instant::now();
    struct Thaw<'a>(&'a Replica);
    impl Drop for Thaw<'_> {
        fn drop(&mut self) {
            self.0.signal("CONT");
        }
    }
    let thaw = Thaw(&reps[first]);
    let (id, _) = submit_and_receive(&app, &s, &agent, "while-frozen", true).await;
    let took = frozen.elapsed();
    eprintln!("leader frozen to a task placed by the next leader: {took:?}");
    assert!(
        took < Duration::from_secs(6),
        "a frozen leader cost {took:?} of placement"
    );
    placed.push(id);
    let health = health_of(&reps[other]).await.unwrap();
    assert_eq!(health["role"], "leader", "{health}");
    assert!(
        health_of(&reps[first]).await.is_none(),
        "the frozen server answered"
    );

    tokio::time::sleep(Duration::from_secs(20).saturating_sub(frozen.elapsed())).await;
    drop(thaw);
    // Woken: it follows, and the other leads on, never two at once.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let roles = [
            health_of(&reps[0]).await.map(|h| h["role"].clone()),
            health_of(&reps[1]).await.map(|h| h["role"].clone()),
        ];
        let leaders = roles
            .iter()
            .filter(|r| r.as_ref().is_some_and(|r| r == "leader"))
            .count();
        assert!(leaders < 2, "two servers lead at once: {roles:?}");
        if roles[first].as_ref().is_some_and(|r| r == "follower") && leaders == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the woken leader never stepped down: {roles:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..2 {
        placed.push(
            submit_and_receive(&app, &s, &agent, &format!("after{i}"), true)
                .await
                .0,
        );
    }
    for id in &placed {
        let t = s.get(&app, &format!("/api/v1/tasks/{id}")).await;
        assert_eq!(t["attempts"], 1, "{t}");
        assert_eq!(t["state"], "completed", "{t}");
    }
}

#[tokio::test]
async fn a_revoked_key_is_refused_by_every_server_at_once() {
    let app = spawn_app_with(Backend::Postgres, |s| s.run_scheduler = false).await;
    let s = app.signup("k@example.com", "Lab").await;
    let res = s
        .send(
            &app,
            Method::POST,
            "/api/v1/api-keys",
            Some(json!({"name": "ci"})),
        )
        .await;
    let created: Value = res.json().await.unwrap();
    let (key, key_id) = (
        created["key"].as_str().unwrap().to_owned(),
        created["info"]["id"].as_str().unwrap().to_owned(),
    );
    let other = Replica::start(&app);
    let deadline = Instant::now() + Duration::from_secs(30);
    while other.role().await.is_none() {
        assert!(Instant::now() < deadline, "the other server did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let me = || {
        reqwest::Client::new()
            .get(format!("{}/api/v1/me", other.address))
            .bearer_auth(&key)
            .send()
    };
    // The other server has just read the key, and keeps it for a while...
    assert_eq!(me().await.unwrap().status(), StatusCode::OK);
    let res = s
        .send(
            &app,
            Method::DELETE,
            &format!("/api/v1/api-keys/{key_id}"),
            None,
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    // ...but is told of the revocation, well before what it kept would expire.
    let revoked = Instant::now();
    while me().await.unwrap().status() != StatusCode::UNAUTHORIZED {
        assert!(
            revoked.elapsed() < Duration::from_secs(1),
            "the other server still takes a revoked key"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A person on one server reaches into a task whose agent polls another: the request travels
/// through the database's notifications, and the agent dials the person's server back.
#[tokio::test]
async fn tunnels_reach_an_agent_that_polls_another_server() {
    use crate::tunnels::{connect, exec_path, read_to_end};
    let app = spawn_app_with(Backend::Postgres, |s| s.run_scheduler = false).await;
    let op = app.operator().await;
    let s = app.signup("t@example.com", "Lab").await;
    let rep = Replica::start(&app);
    leader_of(&[&rep], Duration::from_secs(30)).await;
    let runtime =
        autodl_agent::ProcessRuntime::detect(&autodl_agent::IsolationConfig::default()).unwrap();
    let address = rep.address.clone();
    let agent = crate::e2e::start_agent_configured(
        &app,
        &op,
        "rep-t",
        "1xA100-40G",
        std::sync::Arc::new(runtime),
        move |mut c| {
            c.server_url = address;
            c
        },
    )
    .await;
    let id = crate::e2e::submit(
        &app,
        &s,
        json!({"name": "s", "image": "none", "kind": "session", "resources": {"gpu": {"count": 1}}}),
    )
    .await;
    crate::e2e::wait_for(&app, &s, &id, &["running"], 60).await;
    let mut ws = connect(
        &app,
        &s,
        &exec_path(&id, &["sh", "-c", "echo reached $AUTODL_TASK_ID"]),
    )
    .await
    .unwrap();
    let ended = read_to_end(&mut ws, 30).await;
    assert_eq!(ended.stdout, format!("reached {id}\n"), "{ended:?}");
    assert_eq!(ended.exit, Some(0));
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}
