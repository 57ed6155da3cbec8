//! Ports this node leases to the rendezvous of gangs that meet on it: never one port to two
//! live attempts, freed when the attempt ends.
//!
//! A gang whose workers are all on this node meets on the loopback of its attempt (its own
//! network namespace on an isolated node, the host's on a trusted one). The port is one the
//! host has free now, so it cannot clash with a service of the host's either.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// Where a gang meets when all of its workers are on one node (the server's choice).
const LOOPBACK: &str = "127.0.0.1";

#[derive(Debug, Default, Clone)]
pub struct PortLeases {
    held: Arc<Mutex<BTreeSet<u16>>>,
}

/// A leased port; the lease ends when it is dropped.
#[derive(Debug)]
pub struct PortLease {
    port: u16,
    held: Arc<Mutex<BTreeSet<u16>>>,
}

impl PortLease {
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for PortLease {
    fn drop(&mut self) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.port);
    }
}

impl PortLeases {
    /// A port free on the host now and leased to no live attempt.
    pub fn lease(&self) -> std::io::Result<PortLease> {
        for _ in 0..64 {
            let port = std::net::TcpListener::bind((LOOPBACK, 0))?
                .local_addr()?
                .port();
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            if held.insert(port) {
                return Ok(PortLease {
                    port,
                    held: self.held.clone(),
                });
            }
        }
        Err(std::io::Error::other("no free port to lease"))
    }

    /// For a gang that meets on this node's loopback and has no port yet: leases one and
    /// sets it as `MASTER_PORT` (and torchrun's `PET_MASTER_PORT`). `None`: nothing to lease
    /// (one process, a port the task chose, a gang meeting on another node).
    pub fn lease_rendezvous(&self, env: &mut BTreeMap<String, String>) -> Option<PortLease> {
        if env.get("MASTER_ADDR").map(String::as_str) != Some(LOOPBACK)
            || env.contains_key("MASTER_PORT")
        {
            return None;
        }
        let lease = self
            .lease()
            .inspect_err(|e| tracing::warn!(error = %e, "no port for the task's rendezvous"))
            .ok()?;
        env.insert("MASTER_PORT".into(), lease.port.to_string());
        if env.contains_key("PET_MASTER_ADDR") {
            env.insert("PET_MASTER_PORT".into(), lease.port.to_string());
        }
        Some(lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_is_leased_once_until_its_lease_ends() {
        let leases = PortLeases::default();
        let held: Vec<PortLease> = (0..20).map(|_| leases.lease().unwrap()).collect();
        let ports: BTreeSet<u16> = held.iter().map(PortLease::port).collect();
        assert_eq!(ports.len(), 20, "two live leases of one port");
        let first = held[0].port();
        drop(held);
        assert!(leases.held.lock().unwrap().is_empty());
        assert!(!leases.held.lock().unwrap().contains(&first));
    }

    #[test]
    fn only_a_gang_meeting_here_without_a_port_gets_one() {
        let leases = PortLeases::default();
        let mut env = BTreeMap::from([
            ("MASTER_ADDR".to_string(), LOOPBACK.to_string()),
            ("PET_MASTER_ADDR".to_string(), LOOPBACK.to_string()),
        ]);
        let lease = leases.lease_rendezvous(&mut env).unwrap();
        assert_eq!(env["MASTER_PORT"], lease.port().to_string());
        assert_eq!(env["PET_MASTER_PORT"], lease.port().to_string());
        // The task's own port stands; a gang meeting on another node's address gets none.
        assert!(leases.lease_rendezvous(&mut env).is_none());
        let mut elsewhere = BTreeMap::from([("MASTER_ADDR".to_string(), "node-a".to_string())]);
        assert!(leases.lease_rendezvous(&mut elsewhere).is_none());
        assert!(!elsewhere.contains_key("MASTER_PORT"));
    }
}
