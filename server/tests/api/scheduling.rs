//! The live scheduler is fed as the simulator is: each run judged from its own start, service
//! counted once, victims already stopping not replaced, utilisation from the store, usage
//! charged once whichever runner charges it, and the policy and shares from configuration.
//! Time is a manual clock and cycles are driven by the test. Every cycle here also checks the
//! leader's kept task state (built from the change feed) against a full read: none may differ.

use std::sync::Arc;

use autodl_server::clock::{Clock, ManualClock};
use autodl_server::scheduling::{snapshot, Runner};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::agents::FakeAgent;
use crate::helpers::{spawn_app_on_clock, Backend, Session, TestApp};

crate::on_both_backends!(
    a_new_run_is_judged_from_its_own_start,
    usage_is_charged_once_whoever_charges_it,
    a_run_that_ends_while_runs_are_charged_holds_none_back,
    a_charge_from_a_stale_leader_keeps_nothing,
    victims_already_stopping_are_not_replaced,
    utilization_comes_from_the_store_and_unmeasured_time_is_neutral,
    the_policy_and_shares_come_from_configuration,
    a_run_its_node_no_longer_has_is_requeued_at_once,
    a_run_that_completes_while_it_is_being_stopped_is_done,
    a_waiting_task_says_when_it_should_start,
    a_node_reads_its_work_by_the_placement_index,
    a_change_the_feed_misses_is_found_and_repaired,
    a_change_the_feed_misses_is_found_beside_the_cycles,
    a_run_is_stopped_at_its_time_limit_and_ends_timed_out,
    tasks_start_after_the_tasks_they_name,
    a_long_queue_is_explained_beside_the_cycles,
);

struct Cluster {
    app: TestApp,
    clock: Arc<ManualClock>,
    /// Where the test's time 0 is on the clock.
    t0: i64,
    /// What the agent runs, as it tells the server in every poll.
    running: std::sync::Mutex<Vec<(String, u64)>>,
    runner: Runner,
    op: Session,
    agent: FakeAgent,
}

/// One agent node of 4 A100 GPUs on a manual clock; nodes are never judged lost here.
async fn cluster(b: Backend, tweak: impl FnOnce(&mut autodl_server::config::Settings)) -> Cluster {
    let (app, clock) = spawn_app_on_clock(b, |s| {
        s.node_lost_timeout_secs = 10_000_000;
        s.scheduler_state_check_secs = 0;
        tweak(s)
    })
    .await;
    let op = app.operator().await;
    let agent = FakeAgent::join(&app, &op, "n1", "A100-40G", "z1").await;
    let runner = app.runner();
    let t0 = clock.now_ms();
    Cluster {
        app,
        clock,
        t0,
        running: Default::default(),
        runner,
        op,
        agent,
    }
}

impl Cluster {
    fn at(&self, s: i64) {
        self.clock.set(self.t0 + s * 1000);
    }

    async fn cycle(&mut self) {
        self.runner.cycle(self.clock.now_ms()).await.unwrap();
        assert_eq!(self.drift(), 0, "the kept state missed a change");
    }

    fn drift(&self) -> u64 {
        self.app.state.metrics.state_drift.get()
    }

    async fn submit(&self, s: &Session, spec: Value) -> String {
        let res = s
            .send(&self.app, Method::POST, "/api/v1/tasks", Some(spec))
            .await;
        assert_eq!(res.status(), StatusCode::CREATED);
        res.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Polls the agent: (assignments as (task, attempt), tasks it is told to stop).
    async fn poll(&self) -> (Vec<(String, u64)>, Vec<String>) {
        let running = self.running.lock().unwrap().clone();
        let work = self.agent.poll(&running, 0).await;
        let assigned = work["assignments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["task_id"].as_str().unwrap().to_owned(),
                    a["attempt"].as_u64().unwrap(),
                )
            })
            .collect();
        let stop = work["stop"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["task_id"].as_str().unwrap().to_owned())
            .collect();
        (assigned, stop)
    }

    async fn started(&self, task: &str, attempt: u64) {
        let r = self
            .agent
            .call(
                &format!("/api/v1/agent/tasks/{task}/started"),
                json!({"attempt": attempt}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        self.running
            .lock()
            .unwrap()
            .push((task.to_owned(), attempt));
    }

    async fn finished(&self, task: &str, attempt: u64, reason: &str) {
        let code = if reason == "success" { 0 } else { 1 };
        let r = self
            .agent
            .call(
                &format!("/api/v1/agent/tasks/{task}/finished"),
                json!({"attempt": attempt, "exit_code": code, "reason": reason}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        self.running
            .lock()
            .unwrap()
            .retain(|(t, a)| !(t == task && *a == attempt));
    }

    /// Cycles once and starts whatever was assigned; returns the assignments.
    async fn cycle_and_start(&mut self) -> Vec<(String, u64)> {
        self.cycle().await;
        let (assigned, _) = self.poll().await;
        for (t, a) in &assigned {
            self.started(t, *a).await;
        }
        assigned
    }

    async fn task(&self, s: &Session, id: &str) -> Value {
        s.get(&self.app, &format!("/api/v1/tasks/{id}")).await
    }

    async fn snapshot(&self) -> autodl_scheduler::ClusterState {
        let nodes = self
            .app
            .state
            .scheduler
            .nodes(self.app.state.store.as_ref(), self.clock.now_ms())
            .await
            .unwrap();
        let tasks = self
            .app
            .state
            .store
            .scheduling_tasks()
            .await
            .unwrap()
            .into_iter()
            .map(|r| std::sync::Arc::new(snapshot::ActiveTask::new(r)))
            .collect();
        snapshot::load(self.app.state.store.as_ref(), nodes.as_ref().clone(), tasks)
            .await
            .unwrap()
            .snapshot
            .state()
            .clone()
    }

    async fn user_usage(&self, user: &str) -> (f64, f64, f64) {
        let rows = self.app.state.store.load_usage().await.unwrap();
        rows.iter()
            .find(|r| r.scope == "user" && r.subject_id == user)
            .map_or((0.0, 0.0, 0.0), |r| {
                (
                    r.decayed_gpu_seconds,
                    r.window_alloc_gpu_seconds,
                    r.window_busy_gpu_seconds,
                )
            })
    }
}

fn whole_node(name: &str, priority: f64) -> Value {
    json!({"name": name, "image": "i", "command": "train", "priority": priority,
           "resources": {"gpu": {"type": "A100", "count": 4}}, "retry_policy": {"max_retries": 2}})
}

fn half_node(name: &str, priority: f64) -> Value {
    json!({"name": name, "image": "i", "command": "train", "priority": priority,
           "resources": {"gpu": {"type": "A100", "count": 2}}})
}

async fn a_new_run_is_judged_from_its_own_start(b: Backend) {
    let mut c = cluster(b, |_| {}).await;
    let x = c.app.signup("x@example.com", "Lab X").await;
    let y = c.app.signup("y@example.com", "Lab Y").await;
    c.at(0);
    let a = c.submit(&x, whole_node("a", 0.0)).await;
    assert_eq!(c.cycle_and_start().await, vec![(a.clone(), 1)]);
    // Attempt 1 saves a checkpoint late in its run, then fails and is retried at once.
    c.at(1990);
    c.agent
        .save(&a, 1, "checkpoint", 10, &[("w.pt", b"weights")])
        .await;
    c.at(2000);
    c.finished(&a, 1, "error").await;
    assert_eq!(c.cycle_and_start().await, vec![(a.clone(), 2)]);
    // The input the server builds: attempt 2 from its own start, without attempt 1's
    // checkpoint, and with attempt 1's service as the task's.
    let state = c.snapshot().await;
    let run = &state.running[0];
    let t0 = (c.t0 / 1000) as u64;
    assert_eq!(run.started_at, t0 + 2000);
    assert_eq!(run.last_checkpoint_at, None);
    assert_eq!(run.request.attained_gpu_seconds, 4.0 * 2000.0);
    // A minute into attempt 2 a higher-priority task arrives: the new run is protected by
    // `min_runtime_s` (600 s), as in the simulator.
    c.at(2060);
    let bee = c.submit(&y, whole_node("b", 1.0)).await;
    c.cycle().await;
    let (_, stop) = c.poll().await;
    assert!(stop.is_empty(), "the fresh run was preempted: {stop:?}");
    assert_eq!(c.task(&y, &bee).await["state"], "pending");
}

async fn usage_is_charged_once_whoever_charges_it(b: Backend) {
    let mut c = cluster(b, |_| {}).await;
    let x = c.app.signup("x@example.com", "Lab X").await;
    c.at(0);
    let a = c.submit(&x, half_node("a", 0.5)).await;
    c.cycle_and_start().await;
    c.at(100);
    c.cycle().await;
    // Another runner (a restarted server, or another replica that took over) goes on
    // from where the store says the run was charged to.
    c.runner.resign().await.unwrap();
    c.runner = c.app.runner();
    c.at(200);
    c.cycle().await;
    let user = x.id();
    let (used, _, _) = c.user_usage(&user).await;
    // (Usage decays with a week's half-life: 100 s of it are a few hundredths.)
    assert!((used - 400.0).abs() < 0.1, "2 GPUs x 200 s, got {used}");
    let attempts = x.get(&c.app, &format!("/api/v1/tasks/{a}/attempts")).await;
    assert_eq!(attempts[0]["gpu_seconds"], 400.0);
    // While it runs, the task's own service is that of ended runs only (none).
    assert_eq!(
        c.snapshot().await.running[0].request.attained_gpu_seconds,
        0.0
    );
    // It ends between two cycles: the next cycle charges its tail, once.
    c.at(250);
    c.finished(&a, 1, "success").await;
    c.at(300);
    c.cycle().await;
    c.runner.resign().await.unwrap();
    c.runner = c.app.runner();
    c.cycle().await;
    let (used, _, _) = c.user_usage(&user).await;
    assert!((used - 500.0).abs() < 0.1, "2 GPUs x 250 s, got {used}");
    let attempts = x.get(&c.app, &format!("/api/v1/tasks/{a}/attempts")).await;
    assert_eq!(attempts[0]["gpu_seconds"], 500.0);
}

/// With thousands running, a run ends during most charging cycles: it is left for the next
/// cycle to settle from what the store says, and the others are charged now (all or nothing,
/// a busy cluster's usage could go uncharged for ever).
async fn a_run_that_ends_while_runs_are_charged_holds_none_back(b: Backend) {
    let mut c = cluster(b, |_| {}).await;
    let x = c.app.signup("x@example.com", "Lab X").await;
    c.at(0);
    let a = c.submit(&x, half_node("a", 0.5)).await;
    let bee = c.submit(&x, half_node("b", 0.5)).await;
    assert_eq!(c.cycle_and_start().await.len(), 2);
    c.runner.resign().await.unwrap();
    // A cycle reads both runs, and `a` ends before it stores their charges.
    c.at(50);
    let store = c.app.state.store.clone();
    let mut loaded = load_as_a_cycle(&c).await;
    c.finished(&a, 1, "success").await;
    let cfg = autodl_scheduler::PolicyConfig::default();
    let kept = snapshot::charge(store.as_ref(), &mut loaded, c.t0 + 100_000, &cfg)
        .await
        .unwrap()
        .expect("the run still running is charged");
    let kept: Vec<&str> = kept.iter().map(|r| r.task_id.as_str()).collect();
    assert_eq!(kept, vec![bee.as_str()]);
    let user = x.id();
    // What the cycle's policy counts is what was stored: `b`'s 2 GPUs x 100 s.
    let counted = loaded.snapshot.usage().users[&user].decayed_gpu_seconds;
    let (stored, _, _) = c.user_usage(&user).await;
    assert!((stored - 200.0).abs() < 0.1, "got {stored}");
    assert!(
        (counted - stored).abs() < 1e-6,
        "{counted} counted, {stored} stored"
    );
    // The next cycle settles `a` up to its end, once: 2 GPUs x 50 s more.
    c.runner = c.app.runner();
    c.at(100);
    c.cycle().await;
    let (used, _, _) = c.user_usage(&user).await;
    assert!((used - 300.0).abs() < 0.1, "got {used}");
    for (task, gpu_s) in [(&a, 100.0), (&bee, 200.0)] {
        let attempts = x
            .get(&c.app, &format!("/api/v1/tasks/{task}/attempts"))
            .await;
        assert_eq!(attempts[0]["gpu_seconds"], gpu_s, "{task}");
    }
}

/// Reads the store as a cycle does, for a test to charge from it later.
async fn load_as_a_cycle(c: &Cluster) -> snapshot::Loaded {
    let store = c.app.state.store.clone();
    let nodes = c
        .app
        .state
        .scheduler
        .nodes(store.as_ref(), c.clock.now_ms())
        .await
        .unwrap();
    let tasks = store
        .scheduling_tasks()
        .await
        .unwrap()
        .into_iter()
        .map(|r| Arc::new(snapshot::ActiveTask::new(r)))
        .collect();
    snapshot::load(store.as_ref(), nodes.as_ref().clone(), tasks)
        .await
        .unwrap()
}

/// Two leaders for a moment (one deposed mid-cycle): the one whose read is stale finds a run
/// charged by the other and keeps nothing, so its older usage rows overwrite nothing.
async fn a_charge_from_a_stale_leader_keeps_nothing(b: Backend) {
    let mut c = cluster(b, |_| {}).await;
    let x = c.app.signup("x@example.com", "Lab X").await;
    c.at(0);
    let a = c.submit(&x, half_node("a", 0.5)).await;
    assert_eq!(c.cycle_and_start().await.len(), 1);
    c.runner.resign().await.unwrap();
    let mut stale = load_as_a_cycle(&c).await;
    // The new leader charges the run up to 100 s.
    c.runner = c.app.runner();
    c.at(100);
    c.cycle().await;
    // The deposed one would charge it up to 60 s from its older read.
    let store = c.app.state.store.clone();
    let cfg = autodl_scheduler::PolicyConfig::default();
    let kept = snapshot::charge(store.as_ref(), &mut stale, c.t0 + 60_000, &cfg)
        .await
        .unwrap();
    assert!(kept.is_none(), "a stale charge was kept: {kept:?}");
    let (used, _, _) = c.user_usage(&x.id()).await;
    assert!((used - 200.0).abs() < 0.1, "2 GPUs x 100 s, got {used}");
    let attempts = x.get(&c.app, &format!("/api/v1/tasks/{a}/attempts")).await;
    assert_eq!(attempts[0]["gpu_seconds"], 200.0);
}

async fn victims_already_stopping_are_not_replaced(b: Backend) {
    let mut c = cluster(b, |_| {}).await;
    let x = c.app.signup("x@example.com", "Lab X").await;
    let y = c.app.signup("y@example.com", "Lab Y").await;
    c.at(0);
    let first = c.submit(&x, half_node("first", 0.0)).await;
    let second = c.submit(&x, half_node("second", 0.0)).await;
    assert_eq!(c.cycle_and_start().await.len(), 2);
    c.at(900);
    for t in [&first, &second] {
        c.agent.save(t, 1, "checkpoint", 1, &[("w.pt", b"w")]).await;
    }
    c.at(1000);
    let bee = c.submit(&y, half_node("urgent", 1.0)).await;
    c.cycle().await;
    let (_, stop) = c.poll().await;
    assert_eq!(stop.len(), 1, "one victim makes room: {stop:?}");
    let victim = stop[0].clone();
    let other = if victim == first { &second } else { &first };
    // The victim takes its time to stop. Meanwhile the other task checkpoints, so it is now
    // the cheaper victim, and the victim's own checkpoint grows old.
    c.at(1650);
    c.agent
        .save(other, 1, "checkpoint", 2, &[("w.pt", b"w")])
        .await;
    c.at(1700);
    c.cycle().await;
    let state = c.snapshot().await;
    let v = state
        .running
        .iter()
        .find(|r| r.request.id == victim)
        .unwrap();
    assert!(v.preempting, "the policy is told the victim is stopping");
    let (_, stop) = c.poll().await;
    assert_eq!(stop, vec![victim.clone()], "no second victim");
    assert_eq!(c.task(&x, other).await["state"], "running");
    // Once the victim stops, the waiting task takes its GPUs.
    c.finished(&victim, 1, "stopped").await;
    c.cycle().await;
    let (assigned, _) = c.poll().await;
    assert_eq!(assigned, vec![(bee, 1)]);
}

async fn utilization_comes_from_the_store_and_unmeasured_time_is_neutral(b: Backend) {
    let mut c = cluster(b, |_| {}).await;
    let x = c.app.signup("x@example.com", "Lab X").await;
    let y = c.app.signup("y@example.com", "Lab Y").await;
    c.at(0);
    let measured = c.submit(&x, half_node("measured", 0.5)).await;
    c.submit(&y, half_node("unmeasured", 0.5)).await;
    c.cycle_and_start().await;
    let gpus: Vec<u64> = c.task(&x, &measured).await["placement"][0]["gpu_indices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_u64().unwrap())
        .collect();
    for s in [20, 40, 60, 80, 100] {
        c.at(s);
        let at = time::OffsetDateTime::from_unix_timestamp(c.clock.now_ms() / 1000)
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        let samples: Vec<Value> = gpus
            .iter()
            .map(|g| json!({"at": at, "gpu_index": g, "util": 0.25, "mem_used": 1, "mem_total": 42949672960u64, "task_id": measured}))
            .collect();
        let r = c
            .agent
            .call("/api/v1/agent/metrics", json!({"samples": samples}))
            .await;
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
    }
    // A runner that never saw these samples arrive (they went to the store, as they would
    // on another replica) charges them.
    c.runner.resign().await.unwrap();
    c.runner = c.app.runner();
    c.cycle().await;
    let (_, alloc, busy) = c.user_usage(&x.id()).await;
    assert!(
        alloc > 0.0 && (busy / alloc - 0.25).abs() < 1e-6,
        "{busy} / {alloc}"
    );
    // No samples: the time counts as usage but says nothing about utilisation.
    let (used, alloc, busy) = c.user_usage(&y.id()).await;
    assert!(used > 0.0);
    assert_eq!((alloc, busy), (0.0, 0.0));
}

async fn the_policy_and_shares_come_from_configuration(b: Backend) {
    let mut c = cluster(b, |s| {
        s.policy.preempt_margin = 0.3;
        s.policy.weights.declared = 0.0;
    })
    .await;
    let policy = c.op.get(&c.app, "/api/v1/admin/policy").await;
    assert_eq!(policy["policy"]["preempt_margin"], 0.3);
    assert_eq!(policy["policy"]["weights"]["declared"], 0.0);
    assert!(policy["applies"].as_str().unwrap().contains("restart"));
    let x = c.app.signup("x@example.com", "Lab X").await;
    let y = c.app.signup("y@example.com", "Lab Y").await;
    // An administrator gives Lab X four times Lab Y's share.
    let tenant_x = x.user["tenant_id"].as_str().unwrap().to_owned();
    let res =
        c.op.send(
            &c.app,
            Method::PUT,
            &format!("/api/v1/admin/tenants/{tenant_x}/quota"),
            Some(json!({"share": 4.0})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    // Both labs use the same GPU time, then both wait behind a full node.
    c.at(0);
    let a = c.submit(&x, half_node("a", 0.5)).await;
    let bee = c.submit(&y, half_node("b", 0.5)).await;
    c.cycle_and_start().await;
    c.at(3600);
    c.cycle().await;
    let wx = c.submit(&x, half_node("x2", 0.5)).await;
    let wy = c.submit(&y, half_node("y2", 0.5)).await;
    c.cycle().await;
    let fx = c.task(&x, &wx).await["waiting"]["priority"]["fair_share"]
        .as_f64()
        .unwrap();
    let fy = c.task(&y, &wy).await["waiting"]["priority"]["fair_share"]
        .as_f64()
        .unwrap();
    assert!(
        fx > fy + 0.1,
        "a larger share ranks higher at equal use: {fx} vs {fy}"
    );
    let _ = (a, bee);
}

async fn a_run_its_node_no_longer_has_is_requeued_at_once(b: Backend) {
    let mut c = cluster(b, |_| {}).await;
    let x = c.app.signup("x@example.com", "Lab X").await;
    c.at(0);
    let a = c
        .submit(
            &x,
            json!({"name": "a", "image": "i", "command": "train", "retry_policy": {"max_retries": 1},
                   "resources": {"gpu": {"type": "A100", "count": 1}}}),
        )
        .await;
    assert_eq!(c.cycle_and_start().await, vec![(a.clone(), 1)]);
    // The agent restarts and has forgotten the run: its first poll says so.
    c.at(60);
    c.running.lock().unwrap().clear();
    let (assigned, _) = c.poll().await;
    assert!(assigned.is_empty());
    let t = c.task(&x, &a).await;
    assert_eq!(t["state"], "pending", "requeued by that one poll: {t}");
    let attempts = x.get(&c.app, &format!("/api/v1/tasks/{a}/attempts")).await;
    assert_eq!(attempts[0]["reason"], "lost");
    // It runs again; a lost run is not the task's failure, so one real failure still
    // leaves it its retry.
    assert_eq!(c.cycle_and_start().await, vec![(a.clone(), 2)]);
    c.at(120);
    c.finished(&a, 2, "error").await;
    assert_eq!(c.task(&x, &a).await["state"], "pending");
    assert_eq!(c.cycle_and_start().await, vec![(a.clone(), 3)]);
}

/// A victim told to stop that finishes its work within its grace period is done, not requeued
/// (the simulator's world completes it too).
async fn a_run_that_completes_while_it_is_being_stopped_is_done(b: Backend) {
    let mut c = cluster(b, |_| {}).await;
    let x = c.app.signup("x@example.com", "Lab X").await;
    let y = c.app.signup("y@example.com", "Lab Y").await;
    c.at(0);
    let a = c.submit(&x, whole_node("a", 0.0)).await;
    assert_eq!(c.cycle_and_start().await, vec![(a.clone(), 1)]);
    c.at(4_900);
    c.agent
        .save(&a, 1, "checkpoint", 1, &[("w.pt", b"w")])
        .await;
    c.at(5_000);
    let bee = c.submit(&y, whole_node("b", 1.0)).await;
    c.cycle().await;
    let (_, stop) = c.poll().await;
    assert_eq!(stop, vec![a.clone()], "the older run is preempted");
    c.at(5_030);
    c.finished(&a, 1, "success").await;
    let t = c.task(&x, &a).await;
    assert_eq!(t["state"], "completed", "{t}");
    assert_eq!(c.cycle_and_start().await, vec![(bee, 1)]);
}

/// The estimate for `task` as the next cycles publish it: the forecast runs beside the cycles
/// (on a blocking thread), so a cycle starts it, the test waits for it, and the next cycle
/// publishes its answer.
async fn estimated_start(c: &mut Cluster, s: &Session, task: &str) -> Value {
    c.cycle().await;
    c.runner.settle_forecast().await;
    c.cycle().await;
    c.task(s, task).await["waiting"]["estimated_start"].clone()
}

async fn a_waiting_task_says_when_it_should_start(b: Backend) {
    let mut c = cluster(b, |_| {}).await;
    let x = c.app.signup("x@example.com", "Lab X").await;
    c.at(0);
    let mut first = whole_node("first", 0.5);
    first["estimated_runtime"] = json!(1_000);
    let first = c.submit(&x, first).await;
    let second = c.submit(&x, whole_node("second", 0.5)).await;
    assert_eq!(c.cycle_and_start().await, vec![(first.clone(), 1)]);
    // The first said it takes 1,000 s: the second should start then.
    let t0 = c.t0;
    let at = |s: i64| Value::from(autodl_server::domain::rfc3339(t0 + s * 1000));
    assert_eq!(estimated_start(&mut c, &x, &second).await, at(1_000));
    // It finished early, after 500 s: the second starts, with no estimate of its own, so its
    // user's history (500 s) says when the third will.
    c.at(500);
    c.finished(&first, 1, "success").await;
    assert_eq!(c.cycle_and_start().await, vec![(second.clone(), 1)]);
    assert!(c.task(&x, &second).await["waiting"].is_null());
    c.at(510);
    let third = c.submit(&x, whole_node("third", 0.5)).await;
    assert_eq!(estimated_start(&mut c, &x, &third).await, at(1_000));
}

/// An agent's poll reads only its node's tasks, from the index of placements, which follows
/// every way a placement ends: a finish, a requeue, a cancel.
async fn a_node_reads_its_work_by_the_placement_index(b: Backend) {
    let mut c = cluster(b, |_| {}).await;
    let x = c.app.signup("x@example.com", "Lab X").await;
    let store = c.app.state.store.clone();
    let ids = |v: Vec<autodl_server::store::TaskRecord>| -> Vec<String> {
        v.into_iter().map(|t| t.id).collect()
    };
    c.at(0);
    let a = c.submit(&x, half_node("a", 0.5)).await;
    let b2 = c.submit(&x, half_node("b", 0.5)).await;
    let waits = c.submit(&x, whole_node("waits", 0.5)).await;
    assert_eq!(c.cycle_and_start().await.len(), 2);
    let mut here = ids(store.node_tasks("n1").await.unwrap());
    here.sort();
    let mut want = vec![a.clone(), b2.clone()];
    want.sort();
    assert_eq!(here, want, "the pending task is on no node");
    assert!(store.node_tasks("elsewhere").await.unwrap().is_empty());
    c.at(100);
    c.finished(&a, 1, "success").await;
    assert_eq!(ids(store.node_tasks("n1").await.unwrap()), vec![b2.clone()]);
    let res = x
        .send(
            &c.app,
            Method::POST,
            &format!("/api/v1/tasks/{b2}/cancel"),
            Some(json!({})),
        )
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(store.node_tasks("n1").await.unwrap().is_empty());
    // The whole-node task now fits; the agent stops the cancelled one and gets the new one.
    c.cycle().await;
    let (assigned, stop) = c.poll().await;
    assert_eq!(assigned, vec![(waits.clone(), 1)]);
    assert_eq!(stop, vec![b2.clone()]);
    assert_eq!(ids(store.node_tasks("n1").await.unwrap()), vec![waits]);
}

/// A change the feed does not carry (here: its trigger dropped behind the server's back) is
/// found by the next check and counted, and the policy then acts on the full read.
async fn a_change_the_feed_misses_is_found_and_repaired(b: Backend) {
    let mut c = cluster(b, |_| {}).await;
    let x = c.app.signup("x@example.com", "Lab X").await;
    c.at(0);
    let a = c.submit(&x, whole_node("a", 0.0)).await;
    let bee = c.submit(&x, whole_node("b", 0.0)).await;
    assert_eq!(c.cycle_and_start().await, vec![(a.clone(), 1)]);
    // The cycle's read of the feed must start past the run's start, or the next read would
    // bring the run's row again whatever the feed says.
    cursor_past_last_change(&c, &a).await;
    c.at(10);
    c.cycle().await;
    drop_the_feed_trigger(&c, b).await;
    // The run ends, and the feed does not say so: kept as it was, the node would look full.
    c.at(20);
    c.finished(&a, 1, "success").await;
    c.at(30);
    c.runner.cycle(c.clock.now_ms()).await.unwrap();
    assert!(c.drift() >= 1, "the missed change is counted");
    let (assigned, _) = c.poll().await;
    assert_eq!(
        assigned,
        vec![(bee, 1)],
        "placed on the freed node by the same cycle"
    );
}

/// Waits until the change feed's cursor has passed the task's last change. On PostgreSQL the
/// cursor is the oldest transaction still running in the whole cluster (other tests' databases
/// included), and the feed brings again every task changed after it: read again, a task whose
/// change the feed missed looks current, and the check has nothing to find.
async fn cursor_past_last_change(c: &Cluster, task: &str) {
    let store = &c.app.state.store;
    for _ in 0..600 {
        let cursor = store.task_change_cursor().await.unwrap();
        let (again, _) = store.scheduling_task_changes(cursor).await.unwrap();
        if again.iter().all(|r| r.task.id != task) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the change feed's cursor stayed at or before the task's last change for 30 s");
}

/// Drops the trigger that feeds the change feed on task updates, behind the server's back.
async fn drop_the_feed_trigger(c: &Cluster, b: Backend) {
    let url = &c.app.state.settings.database_url;
    match b {
        Backend::Sqlite => {
            let db = sqlx::SqlitePool::connect(url).await.unwrap();
            sqlx::query("DROP TRIGGER tasks_rev_on_update")
                .execute(&db)
                .await
                .unwrap();
        }
        Backend::Postgres => {
            let db = sqlx::PgPool::connect(url).await.unwrap();
            sqlx::query("DROP TRIGGER tasks_rev ON tasks")
                .execute(&db)
                .await
                .unwrap();
        }
    }
}

/// Over `scheduler_state_check_beside_over` active tasks the check's full read runs beside
/// the cycles. While runs start, are charged and change beside it, no cycle finds a false
/// drift; a change the feed misses is found by a later cycle's comparison, and the cycle after
/// reads everything and acts on it.
async fn a_change_the_feed_misses_is_found_beside_the_cycles(b: Backend) {
    let mut c = cluster(b, |s| s.scheduler_state_check_beside_over = 0).await;
    let x = c.app.signup("x@example.com", "Lab X").await;
    c.at(0);
    let a = c.submit(&x, whole_node("a", 0.0)).await;
    let bee = c.submit(&x, whole_node("b", 0.0)).await;
    assert_eq!(c.cycle_and_start().await, vec![(a.clone(), 1)]);
    // Every cycle starts a read or compares one (`Cluster::cycle` asserts no drift), across
    // the run's charges every 10 s.
    for s in 1..=8 {
        c.at(s * 5);
        c.cycle().await;
        c.runner.settle_state_check().await;
    }
    drop_the_feed_trigger(&c, b).await;
    c.at(50);
    c.finished(&a, 1, "success").await;
    let mut cycles = 0;
    while c.drift() == 0 {
        assert!(cycles < 50, "no cycle compared the read beside it");
        c.at(51 + cycles);
        c.runner.cycle(c.clock.now_ms()).await.unwrap();
        c.runner.settle_state_check().await;
        cycles += 1;
    }
    c.at(52 + cycles);
    c.runner.cycle(c.clock.now_ms()).await.unwrap();
    let (assigned, _) = c.poll().await;
    assert_eq!(
        assigned,
        vec![(bee, 1)],
        "placed on the freed node by the cycle after"
    );
}

/// At its `time_limit` a run gets the stop order (SIGTERM, then the grace period), and its
/// task ends `timed_out` without spending its retries; a run that ends by itself within the
/// limit is untouched, and the limit counts from each run's own start.
async fn a_run_is_stopped_at_its_time_limit_and_ends_timed_out(b: Backend) {
    let mut c = cluster(b, |_| {}).await;
    let x = c.app.signup("x@example.com", "Lab X").await;
    c.at(0);
    let mut spec = whole_node("limited", 0.5);
    spec["time_limit"] = json!("2m");
    let a = c.submit(&x, spec).await;
    assert_eq!(c.task(&x, &a).await["spec"]["time_limit"], 120);
    assert_eq!(c.cycle_and_start().await, vec![(a.clone(), 1)]);
    c.at(119);
    c.cycle().await;
    assert!(c.poll().await.1.is_empty(), "not before the limit");
    c.at(120);
    c.cycle().await;
    assert_eq!(c.poll().await.1, vec![a.clone()], "stopped at the limit");
    assert_eq!(
        c.task(&x, &a).await["state"],
        "running",
        "until the agent says it stopped"
    );
    c.at(135);
    c.finished(&a, 1, "stopped").await;
    let t = c.task(&x, &a).await;
    assert_eq!(t["state"], "timed_out", "{t}");
    assert!(t["finished_at"].is_string());
    let attempts = x.get(&c.app, &format!("/api/v1/tasks/{a}/attempts")).await;
    assert_eq!(
        attempts.as_array().unwrap().len(),
        1,
        "no retry: {attempts}"
    );
    assert_eq!(attempts[0]["reason"], "timed_out");
    let events = x.get(&c.app, &format!("/api/v1/tasks/{a}/events")).await;
    assert!(
        events
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "timed_out"
                && e["message"].as_str().unwrap().contains("time limit of 2m")),
        "{events}"
    );
    let listed = x.get(&c.app, "/api/v1/tasks?state=timed_out").await;
    assert_eq!(listed["items"][0]["id"], json!(a));
    // A task that finishes within its limit completes; the node is free for it at once.
    let mut spec = whole_node("quick", 0.5);
    spec["time_limit"] = json!(600);
    let q = c.submit(&x, spec).await;
    assert_eq!(c.cycle_and_start().await, vec![(q.clone(), 1)]);
    c.at(700);
    c.finished(&q, 1, "success").await;
    assert_eq!(c.task(&x, &q).await["state"], "completed");
    // Bad limits are refused, naming the field.
    for bad in [json!("soon"), json!(0), json!("0s")] {
        let mut spec = whole_node("bad", 0.5);
        spec["time_limit"] = bad.clone();
        let res = x
            .send(&c.app, Method::POST, "/api/v1/tasks", Some(spec))
            .await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{bad}");
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["error"]["field"], "time_limit", "{bad}: {body}");
    }
}

/// `after`: a task is held out of the policy until the tasks it names end as it needs; when
/// that can no longer happen it is cancelled (or failed, as asked), and the chain follows.
async fn tasks_start_after_the_tasks_they_name(b: Backend) {
    let mut c = cluster(b, |_| {}).await;
    let x = c.app.signup("x@example.com", "Lab X").await;
    let other = c.app.signup("o@example.com", "Other Lab").await;
    c.at(0);
    let mut first = whole_node("first", 0.5);
    first["retry_policy"] = json!({"max_retries": 0});
    let a = c.submit(&x, first).await;
    let after = |name: &str, deps: Vec<&str>, extra: Value| {
        let mut spec = half_node(name, 0.5);
        spec["after"] = json!(deps);
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        spec
    };
    let needs_ok = c
        .submit(&x, after("needs-ok", vec![a.as_str()], json!({})))
        .await;
    let needs_end = c
        .submit(
            &x,
            after("needs-end", vec![a.as_str()], json!({"after_when": "any"})),
        )
        .await;
    let chained = c
        .submit(
            &x,
            after(
                "chained",
                vec![needs_ok.as_str()],
                json!({"after_failure": "fail"}),
            ),
        )
        .await;
    // Only the first runs; the others say what they wait for.
    assert_eq!(c.cycle_and_start().await, vec![(a.clone(), 1)]);
    c.cycle().await;
    let w = &c.task(&x, &needs_ok).await["waiting"];
    assert_eq!(w["reason"], "dependency", "{w}");
    // Named as its owner knows it, and running once placed.
    let up = c.task(&x, &a).await;
    assert_eq!(
        w["message"],
        format!(
            "waits for task #{} ({}) to complete; it is running",
            up["number"],
            up["name"].as_str().unwrap()
        )
    );
    let w = &c.task(&x, &chained).await["waiting"];
    let upstream = c.task(&x, &needs_ok).await;
    assert!(
        w["message"]
            .as_str()
            .unwrap()
            .contains(&format!("#{} (needs-ok)", upstream["number"])),
        "{w}"
    );
    // Submission refuses what could never be met, naming the field.
    for (spec, why) in [
        (
            after(
                "unknown",
                vec!["01a00000-0000-7000-8000-000000000000"],
                json!({}),
            ),
            "no task",
        ),
        (after("theirs", vec![a.as_str()], json!({})), "no task"),
    ] {
        let who = if spec["name"] == "theirs" { &other } else { &x };
        let res = who
            .send(&c.app, Method::POST, "/api/v1/tasks", Some(spec))
            .await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST);
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["error"]["field"], "after", "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(why),
            "{body}"
        );
    }
    // The first fails: what needed it to complete is cancelled, what needed it to end starts,
    // and the chain behind the cancelled one fails, as it asked.
    c.at(100);
    c.finished(&a, 1, "error").await;
    assert_eq!(c.task(&x, &a).await["state"], "failed");
    assert_eq!(c.cycle_and_start().await, vec![(needs_end.clone(), 1)]);
    let t = c.task(&x, &needs_ok).await;
    assert_eq!(t["state"], "cancelled", "{t}");
    let events = x
        .get(&c.app, &format!("/api/v1/tasks/{needs_ok}/events"))
        .await;
    assert!(
        events.as_array().unwrap().iter().any(|e| e["message"]
            .as_str()
            .unwrap()
            .contains(&format!("task {a} ended failed"))),
        "{events}"
    );
    c.cycle().await;
    assert_eq!(c.task(&x, &chained).await["state"], "failed");
    // A failed task cannot be waited for with `ok`; with `any` it can.
    let res = x
        .send(
            &c.app,
            Method::POST,
            "/api/v1/tasks",
            Some(after("late", vec![a.as_str()], json!({}))),
        )
        .await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let late = c
        .submit(
            &x,
            after(
                "late-any",
                vec![a.as_str(), needs_end.as_str()],
                json!({"after_when": "any"}),
            ),
        )
        .await;
    c.cycle().await;
    assert_eq!(c.task(&x, &late).await["state"], "pending");
    c.at(200);
    c.finished(&needs_end, 1, "success").await;
    assert_eq!(c.cycle_and_start().await, vec![(late, 1)]);
}

/// A queue longer than the server explains in every cycle is explained beside the cycles,
/// every little while: the cycles between place the same and leave the explanations stored.
async fn a_long_queue_is_explained_beside_the_cycles(b: Backend) {
    let mut c = cluster(b, |_| {}).await;
    let x = c.app.signup("x@example.com", "Lab X").await;
    c.at(0);
    let first = c.submit(&x, whole_node("first", 0.9)).await;
    let mut queued = Vec::new();
    for i in 0..1_001 {
        queued.push(c.submit(&x, whole_node(&format!("q{i}"), 0.5)).await);
    }
    // The first takes the node; the explanation of the rest comes from beside the cycle.
    assert_eq!(c.cycle_and_start().await, vec![(first.clone(), 1)]);
    c.runner.settle_explanations().await;
    let waiting = |t: Value| t["waiting"].clone();
    for id in [&queued[0], &queued[1_000]] {
        let w = waiting(c.task(&x, id).await);
        assert_eq!(w["reason"], "resources", "{w}");
    }
    let head = waiting(c.task(&x, &queued[0]).await)["position"]
        .as_u64()
        .unwrap();
    let tail = waiting(c.task(&x, &queued[1_000]).await)["position"]
        .as_u64()
        .unwrap();
    assert!(head < tail, "{head} {tail}");
    // A moment later the cycle explains nothing, and nothing stored is lost.
    c.at(1);
    let late = c.submit(&x, whole_node("late", 0.5)).await;
    assert!(c.cycle_and_start().await.is_empty());
    c.runner.settle_explanations().await;
    assert!(waiting(c.task(&x, &late).await)["reason"].is_null());
    assert_eq!(waiting(c.task(&x, &queued[0]).await)["reason"], "resources");
    // Ten seconds on, the queue is explained again, the new task too.
    c.at(11);
    assert!(c.cycle_and_start().await.is_empty());
    c.runner.settle_explanations().await;
    assert_eq!(waiting(c.task(&x, &late).await)["reason"], "resources");
    // The node frees: the head of the queue starts, and its explanation is gone.
    c.finished(&first, 1, "success").await;
    c.at(12);
    assert_eq!(c.cycle_and_start().await, vec![(queued[0].clone(), 1)]);
    assert!(waiting(c.task(&x, &queued[0]).await).is_null());
}
