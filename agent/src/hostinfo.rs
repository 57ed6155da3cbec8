//! Facts about the host reported at registration.

use std::path::Path;

pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The address this host reaches other hosts from: the source of its route toward a public
/// address (a UDP "connection" sends nothing); the loopback where it has no such route.
pub fn primary_address() -> std::net::IpAddr {
    let routed = || -> std::io::Result<std::net::IpAddr> {
        let probe = std::net::UdpSocket::bind(("0.0.0.0", 0))?;
        // TEST-NET-2: never a real peer, only a route to look up.
        probe.connect(("198.51.100.1", 9))?;
        Ok(probe.local_addr()?.ip())
    };
    routed()
        .ok()
        .filter(|ip| !ip.is_unspecified())
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
}

/// Cores this process may use (honours CPU affinity, e.g. a container's cpuset).
pub fn cpu_count() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}

/// Total RAM in bytes from /proc/meminfo; 0 when unreadable (non-Linux).
pub fn memory_bytes() -> u64 {
    std::fs::read_to_string(Path::new("/proc/meminfo"))
        .ok()
        .and_then(|s| parse_meminfo_total(&s))
        .unwrap_or(0)
}

fn parse_meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo() {
        let t = "MemTotal:       24576000 kB\nMemFree:  100 kB\n";
        assert_eq!(parse_meminfo_total(t), Some(24576000 * 1024));
        assert_eq!(parse_meminfo_total("junk"), None);
        assert!(cpu_count() >= 1);
        assert!(!hostname().is_empty());
        assert!(memory_bytes() > 0);
        assert!(!primary_address().is_unspecified());
    }
}
