//! Builds the policy's input from the store: the same [`autodl_scheduler::Snapshot`] the
//! simulator runs on, so the live server decides as the simulator measures. Every figure
//! comes from the database (usage, measured utilisation, each run's own start and charges),
//! so whichever server schedules, after whatever restart, computes the same input.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use autodl_common::tasks::TaskSpec;

use autodl_scheduler::{
    EndedRun, Node, PolicyConfig, Quota, Quotas, RunAccount, RunningTask, Snapshot, UsageLedger,
    UserUsage, WorkerPlacement,
};

use crate::store::{
    Accounts, NodeRecord, QuotaRecord, RunChargeRecord, SchedulingTaskRecord, Usage, UsageRecord,
};
use crate::tasks::to_request;

/// The scheduler's view of a node.
pub fn to_node(r: &NodeRecord) -> anyhow::Result<Node> {
    Ok(Node {
        id: r.id.clone(),
        zone: r.zone.clone(),
        labels: r.labels.0.clone(),
        cpu_millis: r.cpu_millis.max(0) as u64,
        mem_bytes: r.mem_bytes.max(0) as u64,
        gpus: r.gpus.0.clone(),
        // Cordoned, draining and lost nodes keep their tasks but get no new ones.
        schedulable: r.schedulable && r.status.takes_new_tasks(),
        taints: crate::tasks::access::node_taints(r),
        features: crate::tasks::access::node_features(r),
        own_network: crate::tasks::access::tasks_have_own_network(r),
    })
}

pub fn to_quota(q: &QuotaRecord) -> Quota {
    Quota {
        max_gpus: q.max_gpus.map(|n| n.clamp(0, u32::MAX as i64) as u32),
        max_gpu_hours_per_month: q.gpu_hours_per_month,
        allowed_gpu_types: q
            .allowed_gpu_types
            .list()
            .map(<[String]>::to_vec)
            .unwrap_or_default(),
        share: q.share,
    }
}

pub async fn load_quotas<S: Accounts + ?Sized>(store: &S) -> anyhow::Result<Quotas> {
    let mut quotas = Quotas::default();
    for row in store.all_quotas().await? {
        let q = to_quota(&row.quota);
        match row.scope.as_str() {
            "tenant" => quotas.tenants.insert(row.subject_id, q),
            _ => quotas.users.insert(row.subject_id, q),
        };
    }
    Ok(quotas)
}

/// "YYYY-MM" <-> [`autodl_scheduler::month_of`]'s numbering.
pub(crate) fn month_text(m: u32) -> String {
    format!("{:04}-{:02}", m / 12, m % 12 + 1)
}

fn month_number(s: &str) -> u32 {
    let mut parts = s.splitn(2, '-');
    match (
        parts.next().and_then(|y| y.parse::<u32>().ok()),
        parts.next().and_then(|m| m.parse::<u32>().ok()),
    ) {
        (Some(y), Some(m)) if (1..=12).contains(&m) => y * 12 + m - 1,
        _ => 0,
    }
}

fn to_usage(r: &UsageRecord) -> UserUsage {
    UserUsage {
        decayed_gpu_seconds: r.decayed_gpu_seconds,
        updated_at: secs(r.updated_at),
        window_alloc_gpu_seconds: r.window_alloc_gpu_seconds,
        window_busy_gpu_seconds: r.window_busy_gpu_seconds,
        month_gpu_seconds: r.month_gpu_seconds,
        month: month_number(&r.month),
    }
}

pub fn usage_record(scope: &str, subject: &str, u: &UserUsage) -> UsageRecord {
    UsageRecord {
        scope: scope.to_owned(),
        subject_id: subject.to_owned(),
        decayed_gpu_seconds: u.decayed_gpu_seconds,
        updated_at: (u.updated_at as i64) * 1000,
        window_alloc_gpu_seconds: u.window_alloc_gpu_seconds,
        window_busy_gpu_seconds: u.window_busy_gpu_seconds,
        month: month_text(u.month),
        month_gpu_seconds: u.month_gpu_seconds,
    }
}

/// Unix milliseconds to the policy's seconds.
pub fn secs(ms: i64) -> u64 {
    (ms / 1000).max(0) as u64
}

fn placements(p: Vec<autodl_common::tasks::WorkerPlacement>) -> Vec<WorkerPlacement> {
    p.into_iter()
        .map(|p| WorkerPlacement {
            node: p.node,
            gpu_indices: p.gpu_indices,
        })
        .collect()
}

/// An active task as the scheduler reads it (the runner keeps these between cycles, see
/// [`super::active`]).
#[derive(Debug, Clone)]
pub struct ActiveTask {
    pub rec: SchedulingTaskRecord,
}

impl ActiveTask {
    pub fn new(mut rec: SchedulingTaskRecord) -> ActiveTask {
        // Only what the scheduler reads is kept current (see migration 0011); the
        // explanation is the scheduler's own output, so it is not kept at all.
        rec.task.waiting = None;
        ActiveTask { rec }
    }

    pub fn id(&self) -> &str {
        &self.rec.task.id
    }

    pub fn spec(&self) -> &TaskSpec {
        &self.rec.task.spec
    }

    /// Where its workers are, while placed.
    pub fn placement(&self) -> &Option<Vec<autodl_common::tasks::WorkerPlacement>> {
        &self.rec.task.placement
    }
}

/// One cycle's input, and what the runner needs to act on the policy's decisions.
pub struct Loaded {
    pub snapshot: Snapshot,
    pub tasks: Vec<Arc<ActiveTask>>,
    /// What each run (task, attempt) had been charged up to in the store, exactly as read:
    /// its charge is kept only if that is still so.
    charged_from: HashMap<(String, u32), i64>,
}

/// Reads everything else the policy looks at, beside the nodes and active tasks the caller
/// has just read.
pub async fn load<S: Accounts + Usage + ?Sized>(
    store: &S,
    nodes: Vec<Node>,
    tasks: Vec<Arc<ActiveTask>>,
) -> anyhow::Result<Loaded> {
    // Independent reads, at once: a cycle waits for the slowest, not for their sum.
    let started = std::time::Instant::now();
    let (quotas, usage_rows, trusted, unsettled) = tokio::try_join!(
        load_quotas(store),
        async { Ok(store.load_usage().await?) },
        async { Ok(store.trusted_tenants().await?) },
        async { Ok::<_, anyhow::Error>(store.unsettled_runs().await?) },
    )?;
    let read = started.elapsed();
    let mut usage = UsageLedger::default();
    for r in usage_rows {
        let u = to_usage(&r);
        match r.scope.as_str() {
            "tenant" => usage.tenants.insert(r.subject_id, u),
            _ => usage.users.insert(r.subject_id, u),
        };
    }
    let trusted: HashSet<String> = trusted.into_iter().collect();
    let mut snapshot = Snapshot::new(nodes.clone(), quotas, usage);
    let mut charged_from = HashMap::new();
    for active in &tasks {
        let (rec, spec) = (&active.rec, active.spec());
        let t = &rec.task;
        let access =
            crate::tasks::access::task_access(trusted.contains(&t.tenant_id), spec, &nodes);
        let request = to_request(t, spec, access);
        let (Some(started), Some(place)) = (rec.run_started_at, active.placement().clone()) else {
            snapshot.add_pending(request);
            continue;
        };
        let started_at = secs(started);
        let attempt = t.attempts.clamp(0, i64::from(u32::MAX)) as u32;
        charged_from.insert(
            (t.id.clone(), attempt),
            rec.run_charged_until.unwrap_or(started),
        );
        snapshot.add_running(
            RunningTask {
                request,
                placements: placements(place),
                started_at,
                last_checkpoint_at: t.last_checkpoint_at.map(secs),
                // Already told to stop (preempted, migrated, drained, cancelled): its GPUs
                // come back soon and must not be paid for twice.
                preempting: t.stop_reason.is_some(),
            },
            RunAccount {
                attempt,
                charged_until: rec.run_charged_until.map_or(started_at, secs),
                gpu_seconds: rec.run_gpu_seconds.unwrap_or(0.0),
            },
        );
    }
    for r in unsettled {
        let probe = autodl_scheduler::TaskRequest {
            gpu_mem_bytes: r.spec.gpu_memory,
            ..to_request(
                &crate::store::TaskRecord {
                    id: r.task_id.clone(),
                    tenant_id: r.tenant_id.clone(),
                    user_id: r.user_id.clone(),
                    ..empty_task(r.spec.clone())
                },
                &r.spec,
                (vec![], vec![]),
            )
        };
        let held_gpus = snapshot.held_gpus(&probe, &placements(r.placement.0.clone()));
        let attempt = r.number.clamp(0, i64::from(u32::MAX)) as u32;
        charged_from.insert(
            (r.task_id.clone(), attempt),
            r.charged_until.unwrap_or(r.started_at),
        );
        snapshot.add_ended(EndedRun {
            task: r.task_id,
            user: r.user_id,
            tenant: r.tenant_id,
            held_gpus,
            ended_at: secs(r.ended_at),
            account: RunAccount {
                attempt,
                charged_until: r.charged_until.map_or(secs(r.started_at), secs),
                gpu_seconds: r.gpu_seconds,
            },
        });
    }
    tracing::debug!(
        read_ms = read.as_millis() as u64,
        build_ms = (started.elapsed() - read).as_millis() as u64,
        "snapshot"
    );
    Ok(Loaded {
        snapshot,
        tasks,
        charged_from,
    })
}

fn empty_task(spec: crate::store::JsonText<TaskSpec>) -> crate::store::TaskRecord {
    crate::store::TaskRecord {
        id: String::new(),
        number: 0,
        tenant_id: String::new(),
        user_id: String::new(),
        name: String::new(),
        state: autodl_common::tasks::TaskState::Pending,
        spec,
        gpus_total: 0,
        idempotency_key: None,
        attempts: 0,
        batch_size: None,
        placement: Default::default(),
        attained_gpu_seconds: 0.0,
        last_checkpoint_at: None,
        created_at: 0,
        updated_at: 0,
        started_at: None,
        finished_at: None,
        stop_reason: None,
        waiting: None,
        results: None,
    }
}

/// Brings accounting up to `now` with the utilisation measured since each run was last
/// charged, and keeps it: the charged runs and the usage rows they changed. A running run that
/// ended since it was read is left for a later cycle, which settles it from the store, and its
/// charge is taken back from the cycle's ledger. Returns the runs' new charges as kept, or
/// `None` when a run was charged or settled by someone else meanwhile (the next cycle charges
/// again from the store).
pub async fn charge(
    store: &dyn Usage,
    loaded: &mut Loaded,
    now_ms: i64,
    cfg: &PolicyConfig,
) -> anyhow::Result<Option<Vec<RunChargeRecord>>> {
    let now = secs(now_ms);
    // Samples since the oldest uncharged moment (at most a window back).
    let from = now_ms - (cfg.util_window_s.min(3_600) as i64) * 1000;
    let util: HashMap<String, f64> = store
        .task_utilization(from, now_ms)
        .await?
        .into_iter()
        .collect();
    let charges = loaded
        .snapshot
        .charge(now, |task| util.get(task).copied(), cfg);
    if charges.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let rows: Vec<RunChargeRecord> = charges
        .iter()
        .map(|c| RunChargeRecord {
            task_id: c.task.clone(),
            number: i64::from(c.account.attempt),
            from: loaded
                .charged_from
                .get(&(c.task.clone(), c.account.attempt))
                .copied()
                .unwrap_or(c.from as i64 * 1000),
            charged_until: c.account.charged_until as i64 * 1000,
            gpu_seconds: c.account.gpu_seconds,
            added: c.gpu_seconds,
            settles: c.ended,
        })
        .collect();
    let take_back = |ledger: &mut UsageLedger, left_out: &[usize]| {
        for c in left_out.iter().map(|&i| &charges[i]) {
            ledger.uncharge(
                &c.user,
                &c.tenant,
                c.gpu_seconds,
                util.get(&c.task).copied(),
                now,
            );
        }
    };
    let usage_rows = |left_out: &[usize]| -> Vec<UsageRecord> {
        // Only the users and tenants a kept charge changed: a row is written whole.
        let kept = charges
            .iter()
            .enumerate()
            .filter(|(i, _)| !left_out.contains(i))
            .map(|(_, c)| c);
        let users: HashSet<&str> = kept.clone().map(|c| c.user.as_str()).collect();
        let tenants: HashSet<&str> = kept.map(|c| c.tenant.as_str()).collect();
        let all = loaded.snapshot.usage();
        let mut ledger = UsageLedger {
            users: users
                .iter()
                .filter_map(|u| all.users.get(*u).map(|x| (u.to_string(), x.clone())))
                .collect(),
            tenants: tenants
                .iter()
                .filter_map(|t| all.tenants.get(*t).map(|x| (t.to_string(), x.clone())))
                .collect(),
        };
        take_back(&mut ledger, left_out);
        let mut rows: Vec<UsageRecord> = ledger
            .users
            .iter()
            .map(|(u, x)| usage_record("user", u, x))
            .collect();
        rows.extend(
            ledger
                .tenants
                .iter()
                .map(|(t, x)| usage_record("tenant", t, x)),
        );
        rows
    };
    let Some(left_out) = store.save_charges(&rows, &usage_rows).await? else {
        return Ok(None);
    };
    if left_out.is_empty() {
        return Ok(Some(rows));
    }
    tracing::debug!(
        left_out = left_out.len(),
        "runs that changed while they were charged are charged by a later cycle"
    );
    for &i in &left_out {
        let c = &charges[i];
        loaded
            .snapshot
            .take_back(c, util.get(&c.task).copied(), now);
    }
    let left_out: HashSet<usize> = left_out.into_iter().collect();
    Ok(Some(
        rows.into_iter()
            .enumerate()
            .filter(|(i, _)| !left_out.contains(i))
            .map(|(_, r)| r)
            .collect(),
    ))
}
