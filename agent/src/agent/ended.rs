//! What an ended attempt leaves (its end report, results and last checkpoint): kept in the
//! outbox ([`crate::outbox`]) and uploaded from there until the server has them, or given up
//! and said so.

use super::*;

/// An upload that will never go through (a bad request, an unreadable file), as opposed to one to try again
/// later: the server or storage away, the organization's storage quota full (its people may
/// free some), the attempt superseded (handled as stale).
pub(super) fn refused_for_good(e: &artifacts::TransferError) -> bool {
    matches!(e, artifacts::TransferError::Client(c) if !c.is_transient() && !c.is_unauthorized())
}

/// The kinds of folder an attempt saves.
pub(super) const CHECKPOINT: &str = "checkpoint";
pub(super) const RESULTS: &str = "results";

/// Keeps the ended attempt in the outbox ([`crate::outbox`]), then uploads its folders from
/// there; returns it with what is left to upload. Where the node's disk refuses to keep it,
/// the folders are uploaded from the task's own, and results that fail are said lost.
pub(super) async fn save_at_end(
    inner: &Inner,
    mut kept: Kept,
    (checkpoint_dir, results_dir, owner): (&std::path::Path, &std::path::Path, Option<u32>),
    log: &LogBuffer,
    shutdown: &CancellationToken,
) -> Kept {
    let source = |kind: &str| {
        if kind == CHECKPOINT {
            checkpoint_dir
        } else {
            results_dir
        }
    };
    let folders: Vec<(&str, &std::path::Path, Option<u32>)> = kept
        .parts
        .iter()
        .map(|p| (p.kind.as_str(), source(&p.kind), owner))
        .collect();
    let durable = {
        let (outbox, record) = (inner.outbox.clone(), kept.clone());
        let owned: Vec<(String, std::path::PathBuf, Option<u32>)> = folders
            .iter()
            .map(|(k, p, o)| (k.to_string(), p.to_path_buf(), *o))
            .collect();
        // Hard links, or copies across file systems, and an fsync: off the async threads.
        tokio::task::spawn_blocking(move || {
            let folders: Vec<(&str, &std::path::Path, Option<u32>)> = owned
                .iter()
                .map(|(k, p, o)| (k.as_str(), p.as_path(), *o))
                .collect();
            outbox.keep(&record, &folders)
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    };
    let durable = match durable {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(task = kept.task_id, error = %e, "could not keep an ended attempt on this node");
            log.push(
                Stream::Stderr,
                format!("[autodl-agent] this node could not keep what the run saved ({e}); uploading it from the task's folder"),
            );
            false
        }
    };
    let key = (kept.task_id.clone(), kept.attempt());
    for part in kept.parts.clone() {
        let (dir, from) = if durable {
            (inner.outbox.folder(&kept, &part.kind), None)
        } else {
            (source(&part.kind).to_path_buf(), owner)
        };
        let r = upload_and_log(
            inner,
            &key,
            &part.kind,
            (&dir, from),
            Some((part.step, part.epoch)),
            Some(log),
            shutdown,
        )
        .await;
        let done = match &r {
            Ok(_) | Err(artifacts::TransferError::Stale) => true,
            Err(e) if refused_for_good(e) => {
                if part.kind == RESULTS {
                    kept.report.not_kept = Some(format!("the server refused them ({e})"));
                }
                true
            }
            Err(e) if !durable => {
                if part.kind == RESULTS {
                    kept.report.not_kept = Some(format!(
                        "the node's disk could not keep them and their upload failed ({e})"
                    ));
                }
                true
            }
            Err(_) => {
                log.push(
                    Stream::Stderr,
                    format!("[autodl-agent] the {} is kept on this node and uploaded when the server and storage take it", part.kind),
                );
                false
            }
        };
        if done {
            if durable {
                kept = drop_kept_part(inner, kept, &part.kind).await;
            } else {
                kept.parts.retain(|p| p.kind != part.kind);
            }
        }
    }
    kept
}

/// The server has one part of a kept attempt (or will never take it): its copy goes, off the
/// async threads (a results folder may be large), and the record says so.
pub(super) async fn drop_kept_part(inner: &Inner, kept: Kept, kind: &str) -> Kept {
    let (outbox, mut k, kind) = (inner.outbox.clone(), kept.clone(), kind.to_owned());
    tokio::task::spawn_blocking(move || {
        if let Err(e) = outbox.drop_part(&mut k, &kind) {
            tracing::warn!(task = k.task_id, error = %e, "could not update a kept attempt");
        }
        k
    })
    .await
    .unwrap_or(kept)
}

/// How often the outbox is looked at when nothing failed, and the longest wait after failures.
pub(super) const OUTBOX_PERIOD: Duration = Duration::from_secs(5);
pub(super) const OUTBOX_MAX_WAIT: Duration = Duration::from_secs(30);

/// Keeps trying what ended attempts left ([`crate::outbox`]): end reports an earlier agent
/// run could not deliver, and folders the server or storage could not take when the run
/// ended. What is kept longer than `keep_results_for` (and tried at least once since this
/// agent started, so a long downtime alone gives nothing up), or beyond `keep_results_bytes`
/// (the largest first, so one huge folder does not push out everyone else's), is given up and
/// said lost.
pub(super) async fn outbox_loop(inner: Arc<Inner>, stop: CancellationToken) {
    let mut wait = Duration::ZERO;
    let mut tried: std::collections::HashSet<TaskKey> = Default::default();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        let mut failed = false;
        // Reading the folders walks them: off the async threads, which poll and fence.
        let outbox = inner.outbox.clone();
        let listed = tokio::task::spawn_blocking(move || {
            outbox
                .all()
                .into_iter()
                .map(|k| {
                    let bytes = outbox.bytes_of(&k);
                    (k, bytes)
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let limit = &inner.config;
        let mut total: u64 = listed.iter().map(|(_, b)| b).sum();
        let mut over: Vec<(u64, TaskKey)> = Vec::new();
        if total > limit.keep_results_bytes {
            over = listed
                .iter()
                .filter(|(k, _)| !k.parts.is_empty())
                .map(|(k, b)| (*b, (k.task_id.clone(), k.attempt())))
                .collect();
            over.sort_by(|a, b| b.cmp(a));
        }
        let mut evict: std::collections::HashSet<TaskKey> = Default::default();
        for (b, key) in over {
            if total <= limit.keep_results_bytes {
                break;
            }
            total = total.saturating_sub(b);
            evict.insert(key);
        }
        for (listed, _) in listed {
            let key = (listed.task_id.clone(), listed.attempt());
            // An attempt still ending is its supervisor's; read it afresh, it may have moved on.
            if lock(&inner.tasks).contains_key(&key) {
                continue;
            }
            let Some(mut kept) = inner.outbox.load(&key.0, key.1) else {
                continue;
            };
            let age = crate::outbox::unix_now().saturating_sub(kept.kept_at);
            let expired = age >= limit.keep_results_for.as_secs() && tried.contains(&key);
            if !kept.parts.is_empty() && (expired || evict.contains(&key)) {
                let why = if expired {
                    format!(
                        "node {} kept them for {} without the server and storage taking them",
                        limit.node_id,
                        humanize(limit.keep_results_for)
                    )
                } else {
                    format!(
                        "node {}'s room for results waiting to upload ({} bytes) is full",
                        limit.node_id, limit.keep_results_bytes
                    )
                };
                let folders: Vec<_> = kept
                    .parts
                    .iter()
                    .map(|p| inner.outbox.folder(&kept, &p.kind))
                    .collect();
                let _ = tokio::task::spawn_blocking(move || {
                    for f in folders {
                        let _ = std::fs::remove_dir_all(f);
                    }
                })
                .await;
                inner.give_up(&mut kept, &why);
            }
            if !kept.parts.is_empty() {
                tried.insert(key.clone());
            }
            for part in kept.parts.clone() {
                let dir = inner.outbox.folder(&kept, &part.kind);
                let r = upload_and_log(
                    &inner,
                    &key,
                    &part.kind,
                    (&dir, None),
                    Some((part.step, part.epoch)),
                    None,
                    &stop,
                )
                .await;
                // Why results the server was told are uploading will not come after all.
                let lost = match &r {
                    Ok(Some(_)) => None,
                    Ok(None) => Some("their kept copy on the node is gone".to_owned()),
                    Err(artifacts::TransferError::Stale) => {
                        Some("the server no longer takes them for this run".to_owned())
                    }
                    Err(e) if refused_for_good(e) => Some(format!("the server refused them ({e})")),
                    Err(_) => {
                        failed = true;
                        break;
                    }
                };
                if let (Some(why), true) = (lost, part.kind == RESULTS) {
                    if kept.reported {
                        kept.lost.push((part.kind.clone(), why));
                    } else {
                        kept.report.not_kept = Some(why);
                    }
                }
                kept = drop_kept_part(&inner, kept, &part.kind).await;
            }
            if !kept.reported && !inner.report_end(&mut kept, &stop).await {
                return;
            }
            if !inner.tell_lost(&mut kept).await {
                failed = true;
            }
            inner.settle_kept(&kept);
            if kept.parts.is_empty() {
                tried.remove(&key);
            }
            if stop.is_cancelled() {
                return;
            }
        }
        wait = if failed {
            (wait * 2).clamp(OUTBOX_PERIOD, OUTBOX_MAX_WAIT)
        } else {
            OUTBOX_PERIOD
        };
    }
}

/// "3d", "12h", "90s": a keep time as an operator wrote it.
pub(super) fn humanize(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s >= 86_400 && s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s => format!("{s}s"),
    }
}

impl Inner {
    /// Tells the server an attempt ended, with what of it is still uploading, and records
    /// that it knows; the kept attempt goes once nothing of it is left to upload or tell.
    /// False when given up because the agent is leaving (the next start reports it).
    pub(super) async fn report_end(&self, kept: &mut Kept, shutdown: &CancellationToken) -> bool {
        kept.report.uploading = kept.pending();
        let mut delivery = {
            let (task_id, report) = (&kept.task_id, &kept.report);
            self.deliver("finished", shutdown, || {
                self.client.finished(task_id, report)
            })
            .await
        };
        let extras = !kept.report.uploading.is_empty() || kept.report.not_kept.is_some();
        if let (Delivery::Rejected { stale: false }, true) = (&delivery, extras) {
            // A server older than these fields refuses them: its end report without them (it
            // does not say the results are uploading, but the run ends once, here).
            let plain = FinishedReport {
                uploading: vec![],
                not_kept: None,
                ..kept.report.clone()
            };
            delivery = self
                .deliver("finished", shutdown, || {
                    self.client.finished(&kept.task_id, &plain)
                })
                .await;
        }
        if let Delivery::Abandoned = delivery {
            return false;
        }
        // Refused too (it had the report already, or the attempt is no longer current): what
        // is left to upload is tried still, and dropped when the server refuses it as stale.
        kept.reported = true;
        lock(&self.unreported).remove(&(kept.task_id.clone(), kept.attempt()));
        self.settle_kept(kept);
        true
    }

    /// Writes a kept attempt back, or removes it when nothing of it is left.
    pub(super) fn settle_kept(&self, kept: &Kept) {
        if kept.reported && kept.parts.is_empty() && kept.lost.is_empty() {
            self.outbox.remove(&kept.task_id, kept.attempt());
        } else if let Err(e) = self.outbox.save(kept) {
            tracing::warn!(task = kept.task_id, error = %e, "could not update a kept attempt");
        }
    }

    /// Gives up what is kept of an attempt (kept too long, or the room for it is full): the
    /// server is told (with the end report if it has not had it, else in
    /// a report of its own), so the task says plainly that they are lost.
    pub(super) fn give_up(&self, kept: &mut Kept, why: &str) {
        tracing::warn!(
            task = kept.task_id,
            attempt = kept.attempt(),
            why,
            "giving up what an ended attempt left"
        );
        // (Their copies were removed by the caller, off the async threads.)
        for part in std::mem::take(&mut kept.parts) {
            if !kept.reported && part.kind == RESULTS {
                kept.report.not_kept = Some(why.to_owned());
            } else if kept.reported {
                kept.lost.push((part.kind, why.to_owned()));
            }
        }
        self.settle_kept(kept);
    }

    /// Tells the server of parts given up; false while it cannot be reached.
    pub(super) async fn tell_lost(&self, kept: &mut Kept) -> bool {
        while let Some((kind, reason)) = kept.lost.first().cloned() {
            let report = NotKeptReport {
                attempt: kept.attempt(),
                kind,
                reason,
            };
            match self.client.not_kept(&kept.task_id, &report).await {
                Ok(()) => {}
                // 404: a server without this report, or the task is gone; 401/403: this node
                // is no longer let in. Neither will take it later.
                Err(e) if e.is_transient() && e.status() != Some(404) => {
                    tracing::info!(task = kept.task_id, error = %e, "could not tell the server of lost results yet");
                    return false;
                }
                Err(e) => {
                    tracing::warn!(task = kept.task_id, error = %e, "the server refused a lost-results report")
                }
            }
            kept.lost.remove(0);
            self.settle_kept(kept);
        }
        true
    }
}
