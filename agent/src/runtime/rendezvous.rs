//! Whether a gang met. The processes of a gang meet at rank 0's rendezvous
//! (`MASTER_ADDR:MASTER_PORT`: the TCP store of `torch.distributed`'s `env://` and of
//! torchrun, or the coordinator of any framework that follows the convention) and stay
//! connected to it while they train, so the node of rank 0 counts the connections its
//! rendezvous port accepted. A gang that is not all there by its limit cannot train: its
//! attempt ends, saying so, rather than holding its GPUs until torch's own limit (half an
//! hour) or, for a worker that never reaches `init_process_group`, for ever.
//!
//! A gang whose rank 0 never listens at the port (it meets some other way) is not judged.

use std::time::Duration;

use procfs::net::TcpState;

use super::TaskLaunch;

/// How often rank 0's socket table is read while the gang forms.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// The rendezvous of an attempt that this node holds, and what makes it formed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    pub port: u16,
    /// How many processes meet there: every worker (`env://`, a process per node with
    /// `launcher: none`), or the torchrun of every node.
    pub members: usize,
    /// What the members are, for the message.
    pub what: &'static str,
    pub limit: Duration,
}

/// What rank 0's socket table shows of the rendezvous port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    pub listening: bool,
    /// Connections the port accepted that are open.
    pub connected: usize,
}

impl Rendezvous {
    /// The rendezvous `launch`'s attempt meets at when rank 0 (torchrun's node 0) runs on this
    /// node and more than one process meets; `None` otherwise, or when the server set no limit.
    pub fn held_here(launch: &TaskLaunch) -> Option<Rendezvous> {
        let limit = launch.rendezvous_timeout?;
        let env = &launch.env;
        let number = |k: &str| env.get(k).and_then(|v| v.parse::<usize>().ok());
        let port = env.get("MASTER_PORT")?.parse::<u16>().ok()?;
        let (members, what, here) = match number("PET_NNODES") {
            Some(nodes) => (nodes, "nodes' torchrun", number("NODE_RANK") == Some(0)),
            None => {
                let rank0 = if launch.workers.is_empty() {
                    number("RANK") == Some(0)
                } else {
                    launch.workers.iter().any(|w| w.rank == 0)
                };
                (number("WORLD_SIZE")?, "workers", rank0)
            }
        };
        (here && members > 1).then_some(Rendezvous {
            port,
            members,
            what,
            limit,
        })
    }

    /// What the network namespace of process `pid` (rank 0's, or any process of the
    /// attempt's network) shows of the port. A process gone shows nothing.
    pub fn look(&self, pid: u32) -> Seen {
        let Ok(process) = procfs::process::Process::new(pid as i32) else {
            return Seen::default();
        };
        let v4 = process.tcp().unwrap_or_default();
        let v6 = process.tcp6().unwrap_or_default();
        let mut seen = Seen::default();
        for e in v4.iter().chain(&v6) {
            if e.local_address.port() != self.port {
                continue;
            }
            match e.state {
                TcpState::Listen => seen.listening = true,
                TcpState::Established => seen.connected += 1,
                _ => {}
            }
        }
        seen
    }

    /// Resolves, with the reason, when the limit passed and the gang had not formed; never
    /// resolves once it formed, or when nothing met at the port (not this rule's to judge).
    pub async fn unformed(self, pid: Option<u32>) -> String {
        let Some(pid) = pid else {
            return std::future::pending().await;
        };
        let deadline = tokio::time::Instant::now() + self.limit;
        let mut most = Seen::default();
        loop {
            let now = tokio::time::Instant::now();
            let seen = self.look(pid);
            most.listening |= seen.listening;
            most.connected = most.connected.max(seen.connected);
            if seen.connected >= self.members {
                return std::future::pending().await;
            }
            if now >= deadline {
                if !most.listening && most.connected == 0 {
                    tracing::info!(
                        port = self.port,
                        "nothing listens at the gang's rendezvous port: it meets some other way"
                    );
                    return std::future::pending().await;
                }
                return format!(
                    "the gang did not form within {} s: {} of its {} {} reached the rendezvous \
                     (port {} on rank 0's node); set rendezvous_timeout for a longer wait",
                    self.limit.as_secs(),
                    most.connected.min(self.members),
                    self.members,
                    self.what,
                    self.port,
                );
            }
            tokio::time::sleep(LOOK_EVERY.min(deadline - now)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autodl_common::agent::{Assignment, WorkerSlot};
    use std::collections::BTreeMap;

    fn launch(env: &[(&str, &str)], workers: &[u32], limit: Option<u64>) -> TaskLaunch {
        let a = Assignment {
            task_id: "t".into(),
            attempt: 1,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            workers: workers
                .iter()
                .map(|r| WorkerSlot {
                    rank: *r,
                    gpu_indices: vec![*r],
                    env: BTreeMap::new(),
                })
                .collect(),
            rendezvous_timeout: limit,
            ..Default::default()
        };
        TaskLaunch::from_assignment(&a, "n", std::path::Path::new("/tmp/x"), false)
    }

    #[test]
    fn only_the_node_of_rank_0_judges_a_gang_of_several() {
        let gang = [("MASTER_PORT", "29501"), ("WORLD_SIZE", "4")];
        let r = Rendezvous::held_here(&launch(&gang, &[0, 1], Some(60))).unwrap();
        assert_eq!((r.port, r.members, r.what), (29501, 4, "workers"));
        assert_eq!(r.limit, Duration::from_secs(60));
        assert_eq!(
            Rendezvous::held_here(&launch(&gang, &[2, 3], Some(60))),
            None
        );
        assert_eq!(Rendezvous::held_here(&launch(&gang, &[0, 1], None)), None);
        let one = [("MASTER_PORT", "29501"), ("WORLD_SIZE", "1"), ("RANK", "0")];
        assert_eq!(Rendezvous::held_here(&launch(&one, &[], Some(60))), None);
        // torchrun: its agents meet, one per node.
        let torchrun = [
            ("MASTER_PORT", "29502"),
            ("PET_NNODES", "2"),
            ("NODE_RANK", "0"),
        ];
        let r = Rendezvous::held_here(&launch(&torchrun, &[], Some(60))).unwrap();
        assert_eq!((r.members, r.what), (2, "nodes' torchrun"));
        let other = [
            ("MASTER_PORT", "29502"),
            ("PET_NNODES", "2"),
            ("NODE_RANK", "1"),
        ];
        assert_eq!(Rendezvous::held_here(&launch(&other, &[], Some(60))), None);
    }

    fn rendezvous(port: u16, members: usize, limit: Duration) -> Rendezvous {
        Rendezvous {
            port,
            members,
            what: "workers",
            limit,
        }
    }

    // The sockets are real; the waiting is on a paused clock, so nothing here sleeps for real.
    #[tokio::test(start_paused = true)]
    async fn a_gang_is_formed_when_every_member_connected() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let r = rendezvous(port, 2, Duration::from_secs(30));
        let me = std::process::id();
        assert_eq!(
            r.look(me),
            Seen {
                listening: true,
                connected: 0
            }
        );
        let _a = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _b = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_a2, _) = listener.accept().unwrap();
        let (_b2, _) = listener.accept().unwrap();
        assert_eq!(r.look(me).connected, 2);
        // Formed: it never says the gang did not form.
        let judged = tokio::time::timeout(Duration::from_secs(3), r.unformed(Some(me))).await;
        assert!(judged.is_err(), "{judged:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_gang_short_of_members_at_its_limit_says_so() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let _a = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_a2, _) = listener.accept().unwrap();
        let r = rendezvous(port, 3, Duration::from_secs(2));
        let started = tokio::time::Instant::now();
        let why = r.unformed(Some(std::process::id())).await;
        assert!(started.elapsed() >= Duration::from_secs(2));
        assert!(
            why.contains("did not form within 2 s: 1 of its 3 workers"),
            "{why}"
        );
        assert!(why.contains(&format!("port {port}")), "{why}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_gang_that_meets_elsewhere_is_not_judged() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let r = rendezvous(port, 2, Duration::from_secs(1));
        let judged =
            tokio::time::timeout(Duration::from_secs(3), r.unformed(Some(std::process::id())))
                .await;
        assert!(judged.is_err(), "{judged:?}");
    }
}
