//! Group commit of submissions: concurrent requests hand their new task to one writer, which
//! stores whatever has queued up meanwhile in a single transaction and then answers each. A
//! commit (an fsync on SQLite, a round trip and a WAL flush on PostgreSQL) costs about the same
//! for one row as for hundreds, so under load the cost per task falls with the batch, while a
//! lone submission is written at once. A request is answered only after its batch committed:
//! nothing acknowledged is lost on a crash.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::{NewTask, Store, StoreError, StoreResult, TaskCreated};

/// Tasks stored per transaction at most: one commit must not hold the write lock for long.
const MAX_BATCH: usize = 512;

/// Requests waiting for the writer at most; more wait to be queued (backpressure).
const QUEUE: usize = 4 * MAX_BATCH;

type Reply = oneshot::Sender<StoreResult<TaskCreated>>;

/// The submitting side; cheap to share.
#[derive(Clone)]
pub struct GroupCommit {
    tx: mpsc::Sender<(NewTask, Reply)>,
}

impl GroupCommit {
    /// The handle, and the writer to spawn beside the server.
    pub fn new(store: Arc<dyn Store>) -> (GroupCommit, impl std::future::Future<Output = ()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (GroupCommit { tx }, write(store, rx))
    }

    /// Stores `task`; returns once it is committed (or its idempotency key found the task an
    /// earlier request made).
    pub async fn create(&self, task: NewTask) -> StoreResult<TaskCreated> {
        let (reply, answer) = oneshot::channel();
        self.tx.send((task, reply)).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

fn stopped() -> StoreError {
    StoreError::Conflict("the server is shutting down; submit again".into())
}

/// The same failure for every request of a batch that could not be stored.
fn relay(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(f) => StoreError::Unavailable(*f),
        StoreError::Fenced => StoreError::Fenced,
        StoreError::NotFound => StoreError::NotFound,
        StoreError::Conflict(m) => StoreError::Conflict(m.clone()),
        other => StoreError::Database(sqlx::Error::Protocol(other.to_string())),
    }
}

async fn write(store: Arc<dyn Store>, mut rx: mpsc::Receiver<(NewTask, Reply)>) {
    let mut waiting = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut waiting, MAX_BATCH).await > 0 {
        let (tasks, replies): (Vec<NewTask>, Vec<Reply>) = waiting.drain(..).unzip();
        match store.create_tasks(&tasks).await {
            Ok(outcomes) => {
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    let _ = reply.send(outcome);
                }
            }
            Err(e) => {
                if !matches!(e, StoreError::Unavailable(_)) {
                    tracing::error!(error = %e, tasks = tasks.len(), "storing submitted tasks failed");
                }
                for reply in replies {
                    let _ = reply.send(Err(relay(&e)));
                }
            }
        }
    }
}
