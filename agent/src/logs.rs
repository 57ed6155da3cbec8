//! Per-task log buffering between a runtime (which must never block on the network: a full
//! pipe would stall the training process) and the shipper that posts batches to the server.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

use crate::protocol::{now_rfc3339, AgentLogLine, Stream};

/// Longest line kept; longer ones (progress bars without newlines, binary junk) are cut so a
/// single line cannot exhaust the buffer or exceed the server's body limit.
pub const MAX_LINE_BYTES: usize = 16 * 1024;

/// Substrings that mark a CUDA out-of-memory failure, matched case-insensitively. They cover
/// PyTorch, TensorFlow/XLA, cuBLAS/cuDNN and raw CUDA runtime messages.
const OOM_SIGNATURES: &[&str] = &[
    "cuda out of memory",
    "cuda error: out of memory",
    "torch.cuda.outofmemoryerror",
    "outofmemoryerror: cuda",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cudaerrormemoryallocation",
    "cuda_error_out_of_memory",
    "resource_exhausted: out of memory",
];

pub fn is_oom_line(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    OOM_SIGNATURES.iter().any(|s| lower.contains(s))
}

#[derive(Debug, Default)]
struct Queue {
    lines: VecDeque<AgentLogLine>,
    /// Lines dropped since the last batch was taken; reported in a marker line.
    dropped: u64,
    closed: bool,
}

/// Bounded queue of one task's output. When the server is away for long, the oldest lines
/// are dropped (the newest are the ones that explain a failure) and a marker line says how many.
#[derive(Debug)]
pub struct LogBuffer {
    queue: Mutex<Queue>,
    notify: Notify,
    capacity: usize,
    oom: AtomicBool,
}

impl LogBuffer {
    pub fn new(capacity: usize) -> Self {
        LogBuffer {
            queue: Mutex::new(Queue::default()),
            notify: Notify::new(),
            capacity: capacity.max(1),
            oom: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds one line (without its newline). OOM detection happens here, before any line can
    /// be dropped, so a long outage cannot hide the reason a task failed.
    pub fn push(&self, stream: Stream, line: String) {
        self.push_from(stream, line, None);
    }

    /// Adds a line a worker printed (`rank`: the worker, in an attempt of several).
    pub fn push_from(&self, stream: Stream, mut line: String, rank: Option<u32>) {
        if is_oom_line(&line) {
            self.oom.store(true, Ordering::Relaxed);
        }
        if line.len() > MAX_LINE_BYTES {
            let mut cut = MAX_LINE_BYTES;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
        }
        let mut q = self.lock();
        q.lines.push_back(AgentLogLine {
            at: now_rfc3339(),
            stream,
            line,
            rank,
        });
        while q.lines.len() > self.capacity {
            q.lines.pop_front();
            q.dropped += 1;
        }
        drop(q);
        self.notify.notify_one();
    }

    pub fn oom_detected(&self) -> bool {
        self.oom.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.lock().lines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// No more lines will come (the task ended).
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_one();
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Takes up to `max` lines, oldest first, starting with a marker when lines were dropped.
    pub fn take_batch(&self, max: usize) -> Vec<AgentLogLine> {
        self.take_within(max, usize::MAX)
    }

    /// Takes up to `max` lines whose JSON encoding stays within `max_bytes` (at least one line,
    /// so a single long line still moves): the server refuses bodies over its limit, and a batch
    /// it refuses must not cost the lines.
    pub fn take_within(&self, max: usize, max_bytes: usize) -> Vec<AgentLogLine> {
        let mut q = self.lock();
        let mut out = Vec::with_capacity(max.min(q.lines.len() + 1));
        if q.dropped > 0 && max > 0 {
            out.push(AgentLogLine {
                at: now_rfc3339(),
                stream: Stream::Stderr,
                line: format!(
                    "[autodl-agent] {} log lines dropped while the server was unreachable",
                    q.dropped
                ),
                rank: None,
            });
            q.dropped = 0;
        }
        let mut bytes = out.iter().map(encoded_len).sum::<usize>();
        while out.len() < max {
            let Some(next) = q.lines.front() else { break };
            let len = encoded_len(next);
            if !out.is_empty() && bytes + len > max_bytes {
                break;
            }
            bytes += len;
            out.extend(q.lines.pop_front());
        }
        out
    }

    /// Puts back a batch that could not be delivered, ahead of newer lines.
    pub fn requeue_front(&self, lines: Vec<AgentLogLine>) {
        let mut q = self.lock();
        for l in lines.into_iter().rev() {
            q.lines.push_front(l);
        }
        while q.lines.len() > self.capacity {
            q.lines.pop_front();
            q.dropped += 1;
        }
    }

    /// Waits until a batch is worth sending: `flush_lines` lines are queued, or the oldest
    /// queued line has waited `flush_interval`, or the buffer was closed. Batching this way
    /// keeps a chatty task to a few requests a second while quiet tasks still show output
    /// within the interval.
    pub async fn wait_ready(&self, flush_lines: usize, flush_interval: Duration) {
        let deadline = loop {
            let notified = self.notify.notified();
            {
                let q = self.lock();
                if q.closed || q.lines.len() >= flush_lines {
                    return;
                }
                if !q.lines.is_empty() || q.dropped > 0 {
                    break tokio::time::Instant::now() + flush_interval;
                }
            }
            notified.await;
        };
        loop {
            let notified = self.notify.notified();
            {
                let q = self.lock();
                if q.closed || q.lines.len() >= flush_lines {
                    return;
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }
}

/// Bytes a line adds to a batch's JSON body (its encoding plus a separator).
pub fn encoded_len(line: &AgentLogLine) -> usize {
    serde_json::to_vec(line).map_or(line.line.len() * 6 + 64, |v| v.len() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn oom_signatures() {
        for l in [
            "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "torch.cuda.OutOfMemoryError: CUDA out of memory.",
            "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
            "cudaErrorMemoryAllocation: out of memory",
            "RuntimeError: CUDA error: out of memory",
            "2024 W tensorflow RESOURCE_EXHAUSTED: Out of memory while trying to allocate",
        ] {
            assert!(is_oom_line(l), "{l}");
        }
        for l in [
            "epoch 3 loss 0.12",
            "MemoryError",
            "Killed",
            "reduced memory usage by 10%",
        ] {
            assert!(!is_oom_line(l), "{l}");
        }
        let b = LogBuffer::new(10);
        b.push(Stream::Stdout, "step 1".into());
        assert!(!b.oom_detected());
        b.push(Stream::Stderr, "torch.cuda.OutOfMemoryError: boom".into());
        assert!(b.oom_detected());
    }

    #[test]
    fn batches_are_bounded_and_oldest_lines_drop_first() {
        let b = LogBuffer::new(1000);
        for i in 0..1200 {
            b.push(Stream::Stdout, format!("line {i}"));
        }
        assert_eq!(b.len(), 1000);
        assert_eq!(b.dropped(), 200);
        let first = b.take_batch(500);
        assert_eq!(first.len(), 500);
        assert!(
            first[0].line.contains("200 log lines dropped"),
            "{}",
            first[0].line
        );
        assert_eq!(first[1].line, "line 200");
        let second = b.take_batch(1000);
        assert_eq!(second.len(), 501);
        assert_eq!(second.last().unwrap().line, "line 1199");
        assert!(b.take_batch(10).is_empty());

        // A failed delivery goes back in front of newer lines.
        b.push(Stream::Stdout, "newer".into());
        b.requeue_front(second[..2].to_vec());
        let again = b.take_batch(10);
        assert_eq!(
            again.iter().map(|l| l.line.as_str()).collect::<Vec<_>>(),
            ["line 699", "line 700", "newer"]
        );

        let long = "é".repeat(MAX_LINE_BYTES);
        b.push(Stream::Stdout, long);
        assert!(b.take_batch(1)[0].line.len() <= MAX_LINE_BYTES);
    }

    #[tokio::test]
    async fn wait_ready_flushes_on_count_or_interval() {
        let b = Arc::new(LogBuffer::new(10_000));
        // Enough lines: ready at once.
        for i in 0..500 {
            b.push(Stream::Stdout, format!("{i}"));
        }
        let t = Instant::now();
        b.wait_ready(500, Duration::from_secs(10)).await;
        assert!(t.elapsed() < Duration::from_secs(1));
        b.take_batch(1000);

        // A few lines: ready after the interval, not before.
        b.push(Stream::Stdout, "one".into());
        let t = Instant::now();
        b.wait_ready(500, Duration::from_millis(200)).await;
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(190) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
        b.take_batch(1000);

        // Empty: waits for the first line, then the interval.
        let b2 = b.clone();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            b2.push(Stream::Stdout, "late".into());
        });
        let t = Instant::now();
        b.wait_ready(500, Duration::from_millis(200)).await;
        assert!(
            t.elapsed() >= Duration::from_millis(290),
            "{:?}",
            t.elapsed()
        );
        writer.await.unwrap();

        // Closing wakes a waiter.
        b.take_batch(1000);
        let b3 = b.clone();
        let closer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            b3.close();
        });
        tokio::time::timeout(
            Duration::from_secs(2),
            b.wait_ready(500, Duration::from_secs(60)),
        )
        .await
        .expect("close wakes the shipper");
        closer.await.unwrap();
    }
}
