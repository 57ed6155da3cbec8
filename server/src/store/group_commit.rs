//! Group commit: concurrent requests hand their write to one writer, which stores whatever has
//! queued up meanwhile in a single transaction and then answers each. A commit (an fsync on
//! SQLite, a round trip and a WAL flush on PostgreSQL) costs about the same for one row as for
//! hundreds, so under load the cost per write falls with the batch, while a lone write is
//! stored at once. A request is answered only after its batch committed: nothing acknowledged
//! is lost on a crash. Submissions go through one, agents' reports of runs started and ended through two
//! more.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::{NewTask, RunEnd, RunStart, StoreError, StoreResult, TaskCreated, Tasks};

/// Writes stored per transaction at most: one commit must not hold the write lock for long.
const MAX_BATCH: usize = 512;

/// Requests waiting for the writer at most; more wait to be queued (backpressure).
const QUEUE: usize = 4 * MAX_BATCH;

type Reply<A> = oneshot::Sender<StoreResult<A>>;

/// One batch written: an answer per request, in order, or a failure of the whole batch.
pub type BatchWrite<A> = Pin<Box<dyn Future<Output = StoreResult<Vec<StoreResult<A>>>> + Send>>;

/// The requesting side; cheap to share.
pub struct GroupCommit<R, A> {
    tx: mpsc::Sender<(R, Reply<A>)>,
}

impl<R, A> Clone for GroupCommit<R, A> {
    fn clone(&self) -> Self {
        GroupCommit {
            tx: self.tx.clone(),
        }
    }
}

/// Submitted tasks; answered once stored (or once an idempotency key found the task an
/// earlier request made).
pub type Submissions = GroupCommit<NewTask, TaskCreated>;

/// Runs whose process started; answered whether the run was still the task's scheduled one.
pub type Starts = GroupCommit<RunStart, bool>;

/// Runs that ended; answered whether the run was still the task's current one.
pub type Ends = GroupCommit<RunEnd, bool>;

impl Submissions {
    pub fn submissions(store: Arc<dyn Tasks>) -> (Self, impl Future<Output = ()>) {
        GroupCommit::new(store, "submitted tasks", |store, tasks| {
            Box::pin(async move { store.create_tasks(&tasks).await })
        })
    }
}

impl Starts {
    pub fn starts(store: Arc<dyn Tasks>) -> (Self, impl Future<Output = ()>) {
        GroupCommit::new(store, "run starts", |store, starts| {
            Box::pin(async move {
                let marked = store.mark_running_many(&starts).await?;
                Ok(marked.into_iter().map(Ok).collect())
            })
        })
    }
}

impl Ends {
    pub fn ends(store: Arc<dyn Tasks>) -> (Self, impl Future<Output = ()>) {
        GroupCommit::new(store, "run ends", |store, ends| {
            Box::pin(async move {
                let finished = store.finish_attempts(&ends).await?;
                Ok(finished.into_iter().map(Ok).collect())
            })
        })
    }
}

impl<R: Send + 'static, A: Send + 'static> GroupCommit<R, A> {
    /// The handle, and the writer to spawn beside the server. `write` stores one batch.
    pub fn new(
        store: Arc<dyn Tasks>,
        what: &'static str,
        write: fn(Arc<dyn Tasks>, Vec<R>) -> BatchWrite<A>,
    ) -> (Self, impl Future<Output = ()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (GroupCommit { tx }, writer(store, rx, what, write))
    }

    /// Stores `request`; returns its answer once its batch is committed.
    pub async fn submit(&self, request: R) -> StoreResult<A> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((request, reply))
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

fn stopped() -> StoreError {
    StoreError::Conflict("the server is shutting down; send it again".into())
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

async fn writer<R, A>(
    store: Arc<dyn Tasks>,
    mut rx: mpsc::Receiver<(R, Reply<A>)>,
    what: &'static str,
    write: fn(Arc<dyn Tasks>, Vec<R>) -> BatchWrite<A>,
) {
    let mut waiting = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut waiting, MAX_BATCH).await > 0 {
        let (requests, replies): (Vec<R>, Vec<Reply<A>>) = waiting.drain(..).unzip();
        let n = requests.len();
        match write(store.clone(), requests).await {
            Ok(answers) => {
                for (reply, answer) in replies.into_iter().zip(answers) {
                    let _ = reply.send(answer);
                }
            }
            Err(e) => {
                if !matches!(e, StoreError::Unavailable(_)) {
                    tracing::error!(error = %e, writes = n, "storing {what} failed");
                }
                for reply in replies {
                    let _ = reply.send(Err(relay(&e)));
                }
            }
        }
    }
}
