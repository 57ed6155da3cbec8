//! Idle HTTP connections to tasks' ports, kept for the next request: each new one is a tunnel
//! the node's agent dials (one long-poll round trip), and a page loads dozens of files.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::client::conn::http1::SendRequest;

pub type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// A connection unused this long is let go (its tunnel closes).
const IDLE: Duration = Duration::from_secs(60);
/// Connections kept per app; browsers open six at a time.
const PER_APP: usize = 8;

type Key = (String, u16);
/// A connection and when it was last handed out.
type Kept = (SendRequest<Body>, Instant);

#[derive(Default)]
pub struct Pool {
    idle: Mutex<HashMap<Key, Vec<Kept>>>,
}

impl Pool {
    /// A kept connection to the task's port that can take a request now.
    pub fn take(&self, task_id: &str, port: u16) -> Option<SendRequest<Body>> {
        let mut g = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let key = (task_id.to_owned(), port);
        let list = g.get_mut(&key)?;
        list.retain(|(s, at)| !s.is_closed() && at.elapsed() < IDLE);
        let ready = list.iter().position(|(s, _)| s.is_ready());
        let found = ready.map(|i| list.swap_remove(i).0);
        if list.is_empty() {
            g.remove(&key);
        }
        found
    }

    /// Keeps a connection whose answer is on its way: it is taken again once that is read.
    pub fn put(&self, task_id: &str, port: u16, sender: SendRequest<Body>) {
        let mut g = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if g.len() > 4096 {
            g.retain(|_, list| {
                list.retain(|(s, at)| !s.is_closed() && at.elapsed() < IDLE);
                !list.is_empty()
            });
        }
        let list = g.entry((task_id.to_owned(), port)).or_default();
        if list.len() < PER_APP {
            list.push((sender, Instant::now()));
        }
    }
}
