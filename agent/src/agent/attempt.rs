//! One attempt on this node: what it needs from storage before it starts, its run and
//! supervision (periodic checkpoints), and its reports to the server in order.

use super::*;

/// Why an attempt could not start. A transient one (storage or server unreachable, or the
/// agent leaving) hands the task back to the queue instead of counting as a failure.
pub(super) struct PrepareError {
    pub(super) message: String,
    pub(super) transient: bool,
}

impl PrepareError {
    fn from_transfer(what: String, e: artifacts::TransferError) -> Self {
        let transient = match &e {
            artifacts::TransferError::Client(c) => c.is_transient(),
            artifacts::TransferError::Cancelled | artifacts::TransferError::Stale => true,
            artifacts::TransferError::Io(_) => false,
        };
        PrepareError {
            message: format!("{what}: {e}"),
            transient,
        }
    }
}

/// What an attempt needs from object storage around its run.
pub(super) struct StorageJob {
    pub(super) restore: Option<RestoreRef>,
    pub(super) checkpoint_interval: Option<Duration>,
    /// The task asked for checkpoints: the folder is also saved when the attempt ends.
    pub(super) checkpointing: bool,
    /// Rank 0's node: the only one whose checkpoint folder is saved.
    pub(super) saves_checkpoints: bool,
    pub(super) data_from_storage: bool,
    /// The code bundle to unpack as the working directory.
    pub(super) code: Option<String>,
}

/// Downloads what the task needs before it starts: the latest checkpoint and an `s3://`
/// dataset. An error keeps the task from starting (starting from zero instead would let its
/// next checkpoint replace the saved progress).
pub(super) async fn prepare_storage(
    inner: &Inner,
    key: &TaskKey,
    launch: &mut TaskLaunch,
    job: &StorageJob,
    log: &LogBuffer,
    shutdown: &CancellationToken,
) -> Result<(), PrepareError> {
    // A fresh start begins with empty folders: leftovers of an earlier attempt on this node
    // (an upload that never completed) must neither be resumed from nor saved as newer.
    let tmp = launch.tmp_dir();
    for dir in [&launch.checkpoint_dir, &launch.results_dir, &tmp] {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).map_err(|e| PrepareError {
            message: format!("could not prepare {}: {e}", dir.display()),
            transient: false,
        })?;
    }
    std::fs::create_dir_all(launch.home_dir()).map_err(|e| PrepareError {
        message: format!("could not prepare the task's home folder: {e}"),
        transient: false,
    })?;
    // The results folder of each process (made while the task folder is still the agent's own).
    for w in launch.worker_launches() {
        let dir = w.launch.results_dir;
        std::fs::create_dir_all(&dir).map_err(|e| PrepareError {
            message: format!("could not prepare {}: {e}", dir.display()),
            transient: false,
        })?;
    }
    let mut backoff = inner.new_backoff(&format!("{}/prepare", key.0));
    if let Some(id) = &job.code {
        let t = Instant::now();
        let cache = inner.config.state_dir.join("cache").join("code");
        let done = artifacts::fetch_code(
            &inner.client,
            &key.0,
            id,
            &cache,
            &launch.code_dir(),
            &mut backoff,
            shutdown,
        )
        .await
        .map_err(|e| PrepareError::from_transfer("could not fetch the task's code".into(), e))?;
        launch.has_code = true;
        log.push(
            Stream::Stdout,
            format!(
                "[autodl-agent] code {} {}: {} files, {:.1} MB, in {:.1} s",
                &id[..id.len().min(19)],
                if done.cached { "cached" } else { "downloaded" },
                done.files,
                done.bytes as f64 / 1e6,
                t.elapsed().as_secs_f64()
            ),
        );
    }
    if let Some(r) = &job.restore {
        let t = Instant::now();
        let bytes = artifacts::restore(
            &inner.client,
            r,
            &launch.checkpoint_dir,
            &mut backoff,
            shutdown,
        )
        .await
        .map_err(|e| {
            PrepareError::from_transfer(
                format!("could not restore checkpoint {}", r.checkpoint_id),
                e,
            )
        })?;
        launch.mark_restored();
        let step = r.step.map(|s| format!(", step {s}")).unwrap_or_default();
        log.push(
            Stream::Stdout,
            format!(
                "[autodl-agent] restored the checkpoint of attempt {}{step}: {} files, {bytes} bytes in {:.1} s",
                r.attempt,
                r.files.len(),
                t.elapsed().as_secs_f64()
            ),
        );
    }
    if job.data_from_storage {
        let t = Instant::now();
        let cache = inner.config.state_dir.join("cache").join("data");
        let (dir, cached) = {
            // One download per dataset at a time on this node.
            let _guard = inner.data_lock.lock().await;
            artifacts::fetch_data(&inner.client, &key.0, &cache, &mut backoff, shutdown)
                .await
                .map_err(|e| {
                    PrepareError::from_transfer("could not fetch the data path".into(), e)
                })?
        };
        let dir = std::path::absolute(&dir).unwrap_or(dir);
        launch.data = Some(DataMount {
            host: dir,
            requested_path: None,
        });
        log.push(
            Stream::Stdout,
            format!(
                "[autodl-agent] data of {} {} in {:.1} s",
                launch.data_path.as_deref().unwrap_or_default(),
                if cached { "cached" } else { "downloaded" },
                t.elapsed().as_secs_f64()
            ),
        );
    } else if let Some(p) = launch.data_path.clone() {
        // A host path: only inside a dataset root the operator named, links resolved, so a
        // task cannot have the Docker socket or another task's folder mounted.
        let roots = &inner.config.data_roots;
        let Some(real) = crate::isolation::resolve_data_path(&p, roots) else {
            let named: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
            return Err(PrepareError {
                message: format!(
                    "data_path {p:?} is not an existing folder inside a dataset root of this node ({})",
                    if named.is_empty() { "none configured".to_string() } else { named.join(", ") }
                ),
                transient: false,
            });
        };
        launch.data = Some(DataMount {
            host: real,
            requested_path: Some(p),
        });
    }
    Ok(())
}

/// Runs the attempt as its own task user: leases a uid and gives it the task's folders (and,
/// where no mount namespace can show cached data read-only, hard links to it).
pub(super) fn take_task_user(
    inner: &Inner,
    launch: &mut TaskLaunch,
) -> Result<Option<UidLease>, PrepareError> {
    let Some(pool) = &inner.uids else {
        return Ok(None);
    };
    let fail = |what: &str, e: std::io::Error| PrepareError {
        message: format!("{what}: {e}"),
        // Out of uids or a folder that cannot be handed over: another node may do better.
        transient: true,
    };
    let lease = pool.lease().map_err(|e| fail("no task user", e))?;
    let user = lease.user();
    crate::isolation::hand_over_task_dir(&launch.task_dir, user)
        .map_err(|e| fail("could not prepare the task folder", e))?;
    let link = launch.data_link_dir();
    let _ = std::fs::remove_dir_all(&link);
    if inner.runtime.tasks_see_host_paths() {
        if let Some(d) = launch.data.as_ref().filter(|d| d.requested_path.is_none()) {
            crate::isolation::link_tree(&d.host, &link, user.gid)
                .map_err(|e| fail("could not show the data to the task", e))?;
        }
    }
    launch.user = Some(user);
    Ok(Some(lease))
}

/// Uploads one folder and says so in the task's log; returns what was uploaded. `folder`:
/// the folder and, on an isolated node, the task uid whose files it holds.
pub(super) async fn upload_and_log(
    inner: &Inner,
    key: &TaskKey,
    kind: &str,
    (dir, owner): (&std::path::Path, Option<u32>),
    mark: Option<(Option<i64>, Option<f64>)>,
    log: Option<&LogBuffer>,
    cancel: &CancellationToken,
) -> Result<Option<artifacts::Uploaded>, artifacts::TransferError> {
    let (step, epoch) = mark.unwrap_or((None, None));
    let staging = inner.config.state_dir.join("staging");
    let mut backoff = inner.new_backoff(&format!("{}/{kind}", key.0));
    let req = artifacts::UploadRequest {
        task_id: &key.0,
        attempt: key.1,
        kind,
        dir,
        staging: &staging,
        step,
        epoch,
        owner,
    };
    let r = artifacts::upload_folder(&inner.client, req, &mut backoff, cancel).await;
    let said = match &r {
        Ok(Some(u)) => Some((
            Stream::Stdout,
            format!(
                "[autodl-agent] {kind} uploaded: {} files, {} bytes in {:.1} s",
                u.files,
                u.bytes,
                u.took.as_secs_f64()
            ),
        )),
        Ok(None) | Err(artifacts::TransferError::Stale) => None,
        Err(e) => Some((
            Stream::Stderr,
            format!("[autodl-agent] {kind} upload failed: {e}"),
        )),
    };
    match (said, log) {
        (Some((stream, line)), Some(log)) => log.push(stream, line),
        (Some((_, line)), None) => tracing::info!(task = key.0, attempt = key.1, "{line}"),
        (None, _) => {}
    }
    r
}

/// Saves the checkpoint folder every interval (when it changed) and whenever the task leaves
/// the save marker, until `stop`. Returns the fingerprint of the last upload.
pub(super) async fn checkpoint_loop(
    inner: Arc<Inner>,
    key: TaskKey,
    (dir, owner): (std::path::PathBuf, Option<u32>),
    interval: Option<Duration>,
    log: Arc<LogBuffer>,
    stop: CancellationToken,
    shutdown: CancellationToken,
) -> Option<artifacts::Fingerprint> {
    let mut last: Option<artifacts::Fingerprint> = None;
    let mut last_at = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return last,
            _ = tick.tick() => {}
        }
        let mark = artifacts::take_marker(&dir);
        let due = interval.is_some_and(|i| last_at.elapsed() >= i);
        if mark.is_none() && !due {
            continue;
        }
        last_at = Instant::now();
        let Ok(fp) = artifacts::scan(&dir, owner) else {
            continue;
        };
        if mark.is_none() && last.as_ref() == Some(&fp) {
            continue;
        }
        match upload_and_log(
            &inner,
            &key,
            "checkpoint",
            (&dir, owner),
            mark,
            Some(&log),
            &shutdown,
        )
        .await
        {
            Ok(Some(_)) => last = Some(fp),
            Ok(None) => {}
            Err(artifacts::TransferError::Stale) => return last,
            // Logged; the next interval or marker tries again.
            Err(_) => {}
        }
    }
}

pub(super) async fn supervise(
    inner: Arc<Inner>,
    key: TaskKey,
    mut launch: TaskLaunch,
    job: StorageJob,
    stop_rx: watch::Receiver<Option<Duration>>,
    shutdown: CancellationToken,
) {
    let log = Arc::new(LogBuffer::new(inner.config.log_buffer_lines));
    let (started_tx, started_rx) = oneshot::channel();
    let (done_tx, done_rx) = oneshot::channel();
    let reporter = tokio::spawn(report(
        inner.clone(),
        key.clone(),
        log.clone(),
        started_rx,
        done_rx,
        shutdown.clone(),
    ));
    let io = TaskIo {
        output: log.clone(),
        started: started_tx,
        stop: stop_rx.clone(),
    };
    let mut prepared = prepare_storage(&inner, &key, &mut launch, &job, &log, &shutdown).await;
    let mut lease = None;
    if prepared.is_ok() {
        match take_task_user(&inner, &mut launch) {
            Ok(l) => lease = l,
            Err(e) => prepared = Err(e),
        }
    }
    // The environment last: it is built as the task's user, in the task's code.
    let mut environment = None;
    if prepared.is_ok() && launch.environment.is_some() {
        // Each step in the task's timeline too, in order, once each (a server away only
        // loses the event: the log has it).
        let (steps, mut said) = tokio::sync::mpsc::unbounded_channel::<String>();
        let poster = {
            let (inner, key) = (inner.clone(), key.clone());
            tokio::spawn(async move {
                while let Some(message) = said.recv().await {
                    let report = autodl_common::agent::ProgressReport {
                        attempt: key.1,
                        stage: "environment".into(),
                        message,
                    };
                    let post = inner.client.progress(&key.0, &report);
                    if let Ok(Err(e)) = tokio::time::timeout(Duration::from_secs(10), post).await {
                        tracing::debug!(task = key.0, error = %e, "could not report a step");
                    }
                }
            })
        };
        let built = inner
            .environments
            .prepare(
                inner.runtime.as_ref(),
                &launch,
                &log,
                &steps,
                stop_rx.clone(),
            )
            .await;
        drop(steps);
        let _ = poster.await;
        match built {
            Ok(lease) => {
                launch.env_dir = Some(crate::runtime::EnvDir {
                    host: lease.dir.clone(),
                    writable: false,
                });
                environment = Some(lease);
            }
            Err(e) => {
                prepared = Err(PrepareError {
                    transient: e.transient(),
                    message: e.to_string(),
                })
            }
        }
    }
    let prepare_failed = prepared.as_ref().err().map(|e| e.transient);
    let task_dir = launch.task_dir.clone();
    let checkpoint_dir = launch.checkpoint_dir.clone();
    let results_dir = launch.results_dir.clone();
    let owner = launch.user.map(|u| u.uid);
    let loop_stop = CancellationToken::new();
    // Only the first node of a task saves checkpoints (see `rank_zero`).
    if !job.saves_checkpoints {
        loop_stop.cancel();
    }
    let saver = tokio::spawn(checkpoint_loop(
        inner.clone(),
        key.clone(),
        (checkpoint_dir.clone(), owner),
        job.checkpoint_interval,
        log.clone(),
        loop_stop.clone(),
        shutdown.clone(),
    ));
    // A simulated node shows the attempt its GPUs (`nvidia-smi`) from the start.
    let simulated_gpus = inner.backend.is_simulated().then(|| {
        let dir = launch.simulated_gpus_dir();
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::warn!(task = key.0, error = %e, "could not make the simulated GPUs' folder");
        }
        inner.write_simulated_gpus(&dir, &launch.gpu_indices, &now_rfc3339(), &[]);
        dir
    });
    let outcome = match prepared {
        Ok(()) => {
            if let Some(e) = lock(&inner.tasks).get_mut(&key) {
                e.launch = Some(launch.clone());
            }
            inner.runtime.run(launch, io).await
        }
        Err(e) => {
            drop(io);
            Err(RuntimeError::Io(std::io::Error::other(e.message)))
        }
    };
    // No longer in use by this attempt: it may be removed once unused for long.
    drop(environment);
    if let Some(dir) = simulated_gpus {
        let _ = std::fs::remove_dir_all(dir);
    }
    loop_stop.cancel();
    let last_saved = saver.await.unwrap_or_default();
    // Nothing of the task may outlive the attempt: stop what still runs as its uid, and close
    // the folder to every task uid (the next attempt may run as another one).
    if let Some(lease) = lease.take() {
        let _ = tokio::task::spawn_blocking(move || drop(lease)).await;
        if let Err(e) = crate::isolation::seal_task_dir(&task_dir) {
            tracing::warn!(task = key.0, error = %e, "could not close the task folder");
        }
    }
    let mut detail = None;
    let (exit_code, reason) = match outcome {
        // Ended by the agent because its gang never formed: a failure of the attempt, whatever
        // its workers' codes after the SIGTERM.
        Ok(RunOutcome {
            exit_code,
            unformed: Some(why),
            ..
        }) => {
            detail = Some(why);
            (Some(exit_code), ExitReason::Error)
        }
        Ok(o) => (
            Some(o.exit_code),
            classify_exit(
                Some(o.exit_code),
                o.oom_killed,
                log.oom_detected(),
                o.stopped,
            ),
        ),
        Err(e) => {
            tracing::warn!(task = key.0, attempt = key.1, error = %e, "task could not start");
            log.push(
                Stream::Stderr,
                format!("[autodl-agent] could not start the task: {e}"),
            );
            // Storage or the server being away before the start is no fault of the task.
            let stopped = stop_rx.borrow().is_some() || prepare_failed == Some(true);
            (None, classify_exit(None, false, false, stopped))
        }
    };
    tracing::info!(
        task = key.0,
        attempt = key.1,
        ?exit_code,
        reason = reason.as_str(),
        "task ended"
    );
    // The task has stopped (ended, or stopped for preemption or cancel within its grace
    // period): keep what it left and save it, before `finished` lets the server requeue it.
    let mark = artifacts::take_marker(&checkpoint_dir);
    let mut parts = Vec::new();
    if prepare_failed.is_none() {
        if job.saves_checkpoints && (job.checkpointing || last_saved.is_some() || mark.is_some()) {
            let changed = artifacts::scan(&checkpoint_dir, owner).ok() != last_saved;
            if changed || mark.is_some() {
                let (step, epoch) = mark.unwrap_or((None, None));
                parts.push(Part {
                    kind: CHECKPOINT.into(),
                    step,
                    epoch,
                });
            }
        }
        // Whatever ends the task keeps its results, a failure too (its files often say why);
        // a run stopped to go back to the queue leaves them to the attempt that ends it.
        let ends_task = lock(&inner.tasks).get(&key).is_some_and(|e| e.ends_task);
        if reason != ExitReason::Stopped || ends_task {
            parts.push(Part {
                kind: RESULTS.into(),
                step: None,
                epoch: None,
            });
        }
    }
    let kept = Kept {
        task_id: key.0.clone(),
        report: FinishedReport {
            attempt: key.1,
            exit_code: exit_code.map(i64::from),
            reason,
            detail,
            uploading: vec![],
            not_kept: None,
        },
        reported: false,
        parts,
        kept_at: crate::outbox::unix_now(),
        lost: vec![],
    };
    let kept = save_at_end(
        &inner,
        kept,
        (&checkpoint_dir, &results_dir, owner),
        &log,
        &shutdown,
    )
    .await;
    // What the run saved is uploaded or kept in the outbox by now: its folder (a copy of the
    // code, its home, its temporary files, its environment file) goes before the end is
    // reported, or finished tasks fill the node's disk. `remove_dir_all` follows no link the
    // task may have left. The folder is the task's, not the attempt's: one that a newer
    // attempt placed here already uses (the server gave up on this one) is left to it.
    let newer = lock(&inner.tasks)
        .keys()
        .any(|(task, attempt)| *task == key.0 && *attempt > key.1);
    if !newer {
        let dir = task_dir.clone();
        let removed = tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        if let Err(e) = removed {
            tracing::warn!(task = key.0, error = %e, "could not remove the ended attempt's folder");
        }
    }
    if let Some(e) = lock(&inner.tasks).get_mut(&key) {
        e.finished = true;
    }
    inner.push_allocations();
    inner
        .metrics
        .tasks_finished
        .with_label_values(&[reason.as_str()])
        .inc();
    log.close();
    let _ = done_tx.send(kept);
    let _ = reporter.await;
    lock(&inner.tasks).remove(&key);
}

/// Delivers `started`, the output, then `finished`, in that order, for one attempt.
pub(super) async fn report(
    inner: Arc<Inner>,
    key: TaskKey,
    log: Arc<LogBuffer>,
    started_rx: oneshot::Receiver<crate::runtime::Started>,
    done_rx: oneshot::Receiver<Kept>,
    shutdown: CancellationToken,
) {
    let (task_id, attempt) = key.clone();
    let mut current = true;
    if let Ok(started) = started_rx.await {
        if let Some(e) = lock(&inner.tasks).get_mut(&key) {
            e.allocation.pid = started.pid;
        }
        inner.push_allocations();
        if let Delivery::Rejected { stale: true } = inner
            .deliver("started", &shutdown, || {
                inner.client.started(&task_id, attempt)
            })
            .await
        {
            current = false;
        }
    }
    let flush_lines = inner.config.log_flush_lines;
    let flush_interval = inner.config.log_flush_interval;
    tokio::pin!(done_rx);
    let done = loop {
        tokio::select! {
            d = &mut done_rx => break d.ok(),
            () = log.wait_ready(flush_lines, flush_interval) => {
                if log.is_closed() {
                    break (&mut done_rx).await.ok();
                }
                if current {
                    current = inner.ship_logs(&task_id, attempt, &log, &shutdown).await;
                } else {
                    log.take_batch(usize::MAX);
                }
            }
        }
    };
    while current && !log.is_empty() {
        current = inner.ship_logs(&task_id, attempt, &log, &shutdown).await;
        if shutdown.is_cancelled() && !log.is_empty() {
            // One batch per call while leaving; do not hold the shutdown for megabytes.
            break;
        }
    }
    let mut kept = done.unwrap_or_else(|| Kept {
        task_id: task_id.clone(),
        report: FinishedReport {
            attempt,
            exit_code: None,
            reason: ExitReason::Error,
            detail: None,
            uploading: vec![],
            not_kept: None,
        },
        reported: false,
        parts: vec![],
        kept_at: crate::outbox::unix_now(),
        lost: vec![],
    });
    inner.report_end(&mut kept, &shutdown).await;
}
