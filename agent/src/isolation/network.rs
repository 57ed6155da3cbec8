//! A network of its own for each task of the process runtime (root), as a container has.
//!
//! Without one, every task shares the node's loopback: a batch task of one organization
//! could talk to another's app port (which the platform offers only through its
//! authenticated proxy) or to a root-only service of the node, and list every listener. Each
//! attempt gets a network namespace with its own loopback and, where the host has `ip` and
//! `nft`, one end of a veth pair (a /30 of [`NetworkConfig::cidr`]) routed out through the
//! host with address translation:
//!
//! - a task reaches the outside world (package mirrors, experiment trackers) as the host does,
//!   but not the host itself (its services, on any address), not another task, and not
//!   link-local addresses (a cloud's metadata service);
//! - nothing reaches a task from outside but what it answers; people reach its ports only
//!   through the platform's tunnels, which the agent connects from inside the namespace;
//! - the platform's API, when it is on the host's loopback (a single-host install, the demo),
//!   and a resolver there are relayed into the namespace at the same address and port, so
//!   the task's `AUTODL_API_URL` and `/etc/resolv.conf` work unchanged.
//!
//! The rules live in one nftables table (`inet autodl`), the same for every agent of a host.
//! Where the host forwards nothing by default because Docker set its `FORWARD` policy to
//! drop, the task interfaces are allowed in `DOCKER-USER`, the chain Docker keeps for this.

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use nix::sched::{setns, unshare, CloneFlags};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinHandle;

/// Host-side interface names start with this (`adlh<slot>`); the rules match on it.
const HOST_IF: &str = "adlh";
/// The task's side.
const TASK_IF: &str = "eth0";

/// Settings of task networks, part of [`super::IsolationConfig`].
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// Addresses handed to task networks, a /30 each: base address and prefix length.
    pub cidr: (Ipv4Addr, u8),
    /// Host-wide folder of address lease locks, shared by every agent on the host.
    pub lock_dir: PathBuf,
    /// Private networks tasks may reach nevertheless (an internal package mirror, a storage
    /// service): every other private, shared or link-local address is closed to them.
    pub allow: Vec<(Ipv4Addr, u8)>,
}

pub const DEFAULT_TASK_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 213, 0, 0), 16);
pub const DEFAULT_NET_LOCK_DIR: &str = "/run/autodl-agent/net";

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            cidr: DEFAULT_TASK_CIDR,
            lock_dir: PathBuf::from(DEFAULT_NET_LOCK_DIR),
            allow: Vec::new(),
        }
    }
}

/// Parses an IPv4 network of any prefix (`10.1.2.0/24`, `10.1.2.3/32`).
pub fn parse_cidr_any(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (addr, len) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not an IPv4 network such as 10.1.2.0/24"))?;
    let addr: Ipv4Addr = addr
        .parse()
        .map_err(|_| format!("{addr:?} is not an IPv4 address"))?;
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| *l <= 32)
        .ok_or_else(|| format!("the prefix of {s:?} is not 0 to 32 bits"))?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    Ok((Ipv4Addr::from(u32::from(addr) & mask), len))
}

/// Parses `10.213.0.0/16` (a prefix of 8 to 29 bits: room for /30s, not the whole space).
pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (addr, len) = parse_cidr_any(s)?;
    if !(8..=29).contains(&len) {
        return Err(format!("the prefix of {s:?} is not 8 to 29 bits"));
    }
    Ok((addr, len))
}

/// How this host gives tasks their networks; found once at start.
#[derive(Debug, Clone)]
pub struct Networks {
    config: NetworkConfig,
    /// `Ok` when tasks get a way out; `Err` says why they get a loopback only.
    outbound: Result<(), String>,
    nsenter: PathBuf,
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{:?} {:?}: {}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Destinations no task reaches unless the operator allows them: private, shared (carrier
/// NAT, where some clouds keep services) and link-local networks (cloud metadata), loopback,
/// multicast and reserved ones. They hold the host's neighbours: other hosts' services, every
/// Docker container (the platform's own database among them), other tasks.
const CLOSED_V4: &str = "0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, 172.16.0.0/12, 192.0.0.0/24, 192.168.0.0/16, 198.18.0.0/15, 224.0.0.0/3";
const CLOSED_V6: &str = "::1/128, fc00::/7, fe80::/10, ff00::/8";

/// The host's firewall rules for task networks: one table, replaced whole.
fn ruleset(allow: &[(Ipv4Addr, u8)]) -> String {
    let allowed = if allow.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = allow.iter().map(|(a, l)| format!("{a}/{l}")).collect();
        format!(
            "             iifname \"{HOST_IF}*\" ip daddr {{ {} }} accept\n",
            list.join(", ")
        )
    };
    format!(
        "table inet autodl\n\
         delete table inet autodl\n\
         table inet autodl {{\n\
           chain forward {{\n\
             type filter hook forward priority filter; policy accept;\n\
             iifname \"{HOST_IF}*\" oifname \"{HOST_IF}*\" drop\n\
         {allowed}\
             iifname \"{HOST_IF}*\" ip daddr {{ {CLOSED_V4} }} drop\n\
             iifname \"{HOST_IF}*\" ip6 daddr {{ {CLOSED_V6} }} drop\n\
             oifname \"{HOST_IF}*\" ct state established,related accept\n\
             oifname \"{HOST_IF}*\" drop\n\
           }}\n\
           chain input {{\n\
             type filter hook input priority filter; policy accept;\n\
             iifname \"{HOST_IF}*\" ct state established,related accept\n\
             iifname \"{HOST_IF}*\" drop\n\
           }}\n\
           chain postrouting {{\n\
             type nat hook postrouting priority srcnat; policy accept;\n\
             iifname \"{HOST_IF}*\" oifname != \"{HOST_IF}*\" masquerade\n\
           }}\n\
         }}\n"
    )
}

impl Networks {
    /// Sets the host up for task networks. Tasks always get a namespace of their own; `why`
    /// of [`Networks::describe`] tells when they get no way out of it.
    /// `Err` when the host cannot give tasks a network of their own at all (no iproute2 or
    /// nsenter): they then share the host's.
    pub fn detect(config: NetworkConfig) -> Result<Networks, String> {
        run(Command::new("ip").arg("-V")).map_err(|e| format!("iproute2 is missing: {e}"))?;
        let nsenter =
            super::sandbox::which("nsenter").ok_or("nsenter (util-linux) is not installed")?;
        let outbound = Self::prepare_host(&config);
        if let Err(why) = &outbound {
            tracing::warn!(%why, "tasks get a network of their own without outbound access");
        }
        Ok(Networks {
            config,
            outbound,
            nsenter,
        })
    }

    /// Where `nsenter` is, which starts a task's processes in its network.
    pub fn nsenter(&self) -> &Path {
        &self.nsenter
    }

    fn prepare_host(config: &NetworkConfig) -> Result<(), String> {
        let mut nft = Command::new("nft");
        nft.args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = nft
            .spawn()
            .map_err(|e| format!("nftables is missing: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write;
            stdin
                .write_all(ruleset(&config.allow).as_bytes())
                .map_err(|e| format!("nft: {e}"))?;
        }
        let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "the firewall rules were refused: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
            .map_err(|e| format!("cannot enable forwarding: {e}"))?;
        allow_through_docker();
        Ok(())
    }

    /// For the node's page: what network a task gets.
    pub fn describe(&self) -> String {
        match &self.outbound {
            Ok(()) => "a namespace per task, outbound through the host (NAT)".into(),
            Err(why) => format!("a namespace per task, loopback only ({why})"),
        }
    }

    /// A new network for one attempt. `api`: the platform's address when it is on the host's
    /// loopback (relayed in); `resolvers`: loopback resolvers of `/etc/resolv.conf`.
    pub async fn create(&self, name: &str, relayed: &[SocketAddr]) -> io::Result<TaskNetwork> {
        let pins = self.config.lock_dir.join("ns");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&pins)?;
        let pin = pins.join(name);
        let at = pin.clone();
        let ns = tokio::task::spawn_blocking(move || new_namespace(&at))
            .await
            .map_err(io::Error::other)??;
        let mut net = TaskNetwork {
            ns,
            pin,
            slot: None,
            relays: Vec::new(),
            owned: Default::default(),
        };
        if self.outbound.is_ok() {
            let config = self.config.clone();
            let ns = net.ns.try_clone()?;
            let slot = tokio::task::spawn_blocking(move || link(&ns, &config))
                .await
                .map_err(io::Error::other)??;
            net.slot = Some(slot);
        } else {
            let ns = net.ns.try_clone()?;
            tokio::task::spawn_blocking(move || {
                inside(&ns, || {
                    run(Command::new("ip").args(["link", "set", "lo", "up"]))
                        .map_err(io::Error::other)
                })
            })
            .await
            .map_err(io::Error::other)??;
        }
        for addr in relayed {
            net.relay(*addr).await?;
        }
        for addr in resolvers() {
            net.relay_dns(addr).await?;
        }
        Ok(net)
    }
}

/// Allows the task interfaces in Docker's `DOCKER-USER` chain, where Docker drops forwarded
/// packets by default; nothing to do on a host without it.
fn allow_through_docker() {
    if run(Command::new("iptables").args(["-n", "-L", "DOCKER-USER"])).is_err() {
        return;
    }
    let pattern = format!("{HOST_IF}+");
    let rules: [Vec<&str>; 2] = [
        vec!["-i", &pattern, "-j", "ACCEPT"],
        vec![
            "-o",
            &pattern,
            "-m",
            "conntrack",
            "--ctstate",
            "RELATED,ESTABLISHED",
            "-j",
            "ACCEPT",
        ],
    ];
    for rule in rules {
        let present = run(Command::new("iptables")
            .args(["-C", "DOCKER-USER"])
            .args(&rule))
        .is_ok();
        if !present {
            if let Err(e) = run(Command::new("iptables")
                .args(["-I", "DOCKER-USER"])
                .args(&rule))
            {
                tracing::warn!(error = %e, "could not let task networks through Docker's forwarding rules");
            }
        }
    }
}

/// A fresh network namespace, held by the returned handle.
/// A fresh network namespace, held by the returned handle and pinned at `pin` (a bind mount,
/// as `ip netns add` makes) for `nsenter`: the name stands for this namespace only, until it
/// is unmounted.
fn new_namespace(pin: &Path) -> io::Result<File> {
    unpin(pin);
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(pin)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            unshare(CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            let own = Path::new("/proc/thread-self/ns/net");
            nix::mount::mount(
                Some(own),
                pin,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(io::Error::from)?;
            File::open(own)
        })
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
    })
}

/// Takes a pin away (and what an agent that died left at that name).
fn unpin(pin: &Path) {
    let _ = nix::mount::umount2(pin, nix::mount::MntFlags::MNT_DETACH);
    let _ = std::fs::remove_file(pin);
}

/// Runs `f` on a thread of its own inside the namespace `ns` (the thread ends with it, so no
/// thread of the agent's pools is ever left there). Processes `f` starts are in `ns`.
pub fn inside<T: Send>(ns: &File, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            setns(ns, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            f()
        })
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
    })
}

/// One /30 of the task range, leased host-wide (a lock file per slot, as task uids are).
#[derive(Debug)]
struct Slot {
    /// A byte naming the lock folder.
    folder: u8,
    index: u32,
    host: Ipv4Addr,
    task: Ipv4Addr,
    _lock: Flock<File>,
}

fn lease_slot(config: &NetworkConfig) -> io::Result<Slot> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&config.lock_dir)?;
    let (base, len) = config.cidr;
    let slots: RangeInclusive<u32> = 0..=((1u32 << (32 - len)) / 4 - 1);
    for index in slots {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(config.lock_dir.join(index.to_string()))?;
        if let Ok(lock) = Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            let net = u32::from(base) + index * 4;
            let folder = config
                .lock_dir
                .to_string_lossy()
                .bytes()
                .fold(0x811c_9dc5u32, |h, b| {
                    (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
                }) as u8;
            let slot = Slot {
                folder,
                index,
                host: Ipv4Addr::from(net + 1),
                task: Ipv4Addr::from(net + 2),
                _lock: lock,
            };
            // A link of this slot left by an agent that died goes first.
            let _ = run(Command::new("ip").args(["link", "del", &slot.host_if()]));
            return Ok(slot);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!("every task network of {}/{len} is in use", config.cidr.0),
    ))
}

impl Slot {
    /// `adlh<folder><slot>`: agents with separate lock folders never name the same link.
    fn host_if(&self) -> String {
        format!("{HOST_IF}{:02x}{:x}", self.folder, self.index)
    }
}

/// Gives the namespace its loopback and a veth pair out to the host.
fn link(ns: &File, config: &NetworkConfig) -> io::Result<Slot> {
    let slot = lease_slot(config)?;
    let host_if = slot.host_if();
    let agent = std::process::id().to_string();
    let (task_addr, host_addr) = (format!("{}/30", slot.task), format!("{}/30", slot.host));
    let gateway = slot.host.to_string();
    inside(ns, || {
        let steps: [&[&str]; 6] = [
            &["link", "set", "lo", "up"],
            &[
                "link", "add", TASK_IF, "type", "veth", "peer", "name", &host_if,
            ],
            // The agent's own process is in the host's namespace.
            &["link", "set", &host_if, "netns", &agent],
            &["addr", "add", &task_addr, "dev", TASK_IF],
            &["link", "set", TASK_IF, "up"],
            &["route", "add", "default", "via", &gateway],
        ];
        for args in steps {
            run(Command::new("ip").args(args)).map_err(io::Error::other)?;
        }
        Ok(())
    })?;
    for args in [
        &["addr", "add", &host_addr, "dev", &host_if][..],
        &["link", "set", &host_if, "up"],
    ] {
        run(Command::new("ip").args(args)).map_err(io::Error::other)?;
    }
    allow_through_docker();
    Ok(slot)
}

/// The resolvers of the host's `/etc/resolv.conf`: on its loopback (a caching resolver) or on
/// a private network (a cloud's), none of which a task reaches itself, so each is relayed into
/// the namespace at its own address: the task's resolver settings work unchanged, and nothing
/// else of that address (a cloud's metadata service beside its resolver) is reached.
fn resolvers() -> Vec<SocketAddr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// Whether tasks reach `ip` only through a relay: addresses the host's firewall closes to
/// them (loopback, private, shared, link-local).
pub fn needs_relay(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => {
            a.is_loopback()
                || a.is_private()
                || a.is_link_local()
                || a.is_unspecified()
                || (a.octets()[0] == 100 && (a.octets()[1] & 0xc0) == 64)
        }
        IpAddr::V6(a) => {
            a.is_loopback()
                || a.is_unspecified()
                || (a.segments()[0] & 0xfe00) == 0xfc00
                || (a.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

/// The largest DNS message over UDP the relay carries (EDNS's common ceiling).
const DNS_DATAGRAM: usize = 4096;

/// Most connections and datagrams a relay carries at once: a task cannot spend the agent's
/// file handles and memory through it.
const RELAY_CONNECTIONS: usize = 64;
const RELAY_QUERIES: usize = 256;

/// One attempt's network. Dropping it ends its relays; the namespace (and the veth pair with
/// it) goes when the last process in it has exited.
#[derive(Debug)]
pub struct TaskNetwork {
    ns: File,
    /// Where the namespace is pinned, for `nsenter`.
    pin: PathBuf,
    slot: Option<Slot>,
    relays: Vec<JoinHandle<()>>,
    /// Addresses given to the namespace's loopback for relays.
    owned: std::collections::HashSet<IpAddr>,
}

impl Drop for TaskNetwork {
    fn drop(&mut self) {
        for r in &self.relays {
            r.abort();
        }
        unpin(&self.pin);
        if let Some(slot) = &self.slot {
            // Removes both ends now rather than when the namespace is gone.
            let _ = run(Command::new("ip").args(["link", "del", &slot.host_if()]));
        }
    }
}

impl TaskNetwork {
    /// The namespace, for sockets to be made in it (see [`inside`]).
    pub fn namespace(&self) -> &File {
        &self.ns
    }

    /// A path naming the namespace for as long as this network lives, for `nsenter --net=`:
    /// processes are started in it by `nsenter`, from the agent's long-lived threads (a
    /// process started from a thread that then ends would get its parent-death signal, which
    /// bubblewrap asks for). Once the network is gone the path names no namespace at all.
    pub fn path(&self) -> &Path {
        &self.pin
    }

    /// The task's address on its veth link, when it has one.
    pub fn address(&self) -> Option<Ipv4Addr> {
        self.slot.as_ref().map(|s| s.task)
    }

    /// A TCP connection to `addr` as seen from inside the task's network (its own loopback).
    pub async fn connect(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        let ns = self.ns.try_clone()?;
        let stream = tokio::task::spawn_blocking(move || {
            inside(&ns, || std::net::TcpStream::connect_timeout(&addr, timeout))
        })
        .await
        .map_err(io::Error::other)??;
        stream.set_nonblocking(true)?;
        TcpStream::from_std(stream)
    }

    async fn bind_inside<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let ns = self.ns.try_clone()?;
        tokio::task::spawn_blocking(move || inside(&ns, f))
            .await
            .map_err(io::Error::other)?
    }

    /// Gives the namespace's loopback the address `ip` (not itself a loopback one), so that a
    /// relay can listen there.
    async fn own_address(&mut self, ip: IpAddr) -> io::Result<()> {
        if ip.is_loopback() || !self.owned.insert(ip) {
            return Ok(());
        }
        let cidr = match ip {
            IpAddr::V4(a) => format!("{a}/32"),
            IpAddr::V6(a) => format!("{a}/128"),
        };
        self.bind_inside(move || {
            run(Command::new("ip").args(["addr", "add", &cidr, "dev", "lo"]))
                .map_err(io::Error::other)
        })
        .await
    }

    /// Carries TCP connections to `addr` inside the namespace to `addr` on the host.
    async fn relay(&mut self, addr: SocketAddr) -> io::Result<()> {
        self.own_address(addr.ip()).await?;
        let listener = self
            .bind_inside(move || {
                let l = std::net::TcpListener::bind(addr)?;
                l.set_nonblocking(true)?;
                Ok(l)
            })
            .await?;
        let listener = TcpListener::from_std(listener)?;
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(RELAY_CONNECTIONS));
        self.relays.push(tokio::spawn(async move {
            loop {
                let mut inner = match listener.accept().await {
                    Ok((s, _)) => s,
                    // Out of file handles for a moment: the relay stays.
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    continue;
                };
                tokio::spawn(async move {
                    let _slot = slot;
                    if let Ok(mut outer) = TcpStream::connect(addr).await {
                        let _ = tokio::io::copy_bidirectional(&mut inner, &mut outer).await;
                    }
                });
            }
        }));
        Ok(())
    }

    /// Carries DNS (UDP and TCP) to the resolver `addr` into the namespace, at its address.
    async fn relay_dns(&mut self, addr: SocketAddr) -> io::Result<()> {
        self.relay(addr).await?;
        let socket = self
            .bind_inside(move || {
                let s = std::net::UdpSocket::bind(addr)?;
                s.set_nonblocking(true)?;
                Ok(s)
            })
            .await?;
        let socket = std::sync::Arc::new(UdpSocket::from_std(socket)?);
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(RELAY_QUERIES));
        self.relays.push(tokio::spawn(async move {
            let mut buf = vec![0u8; DNS_DATAGRAM];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    continue;
                };
                let query = buf[..n].to_vec();
                let socket = socket.clone();
                tokio::spawn(async move {
                    let _slot = slot;
                    let bind: SocketAddr = if addr.is_ipv4() {
                        (Ipv4Addr::UNSPECIFIED, 0).into()
                    } else {
                        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
                    };
                    let Ok(up) = UdpSocket::bind(bind).await else {
                        return;
                    };
                    // Connected: only the resolver's own answer is taken.
                    let mut answer = vec![0u8; DNS_DATAGRAM];
                    let asked = async {
                        up.connect(addr).await?;
                        up.send(&query).await?;
                        up.recv(&mut answer).await
                    };
                    if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), asked).await {
                        let _ = socket.send_to(&answer[..n], from).await;
                    }
                });
            }
        }));
        Ok(())
    }
}

/// Whether `host` (of a URL) names this host's loopback.
pub fn is_loopback_host(host: &str) -> bool {
    host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `lock_dir`'s place for network leases beside the uid leases.
pub fn lock_dir_beside(uid_lock_dir: &Path) -> PathBuf {
    uid_lock_dir
        .parent()
        .map_or_else(|| PathBuf::from(DEFAULT_NET_LOCK_DIR), |p| p.join("net"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        assert_eq!(
            parse_cidr("10.213.7.9/16").unwrap(),
            (Ipv4Addr::new(10, 213, 0, 0), 16)
        );
        for bad in [
            "10.0.0.0",
            "10.0.0.0/30",
            "10.0.0.0/7",
            "x/16",
            "10.0.0.0/x",
        ] {
            assert!(parse_cidr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn loopback_hosts() {
        for h in ["localhost", "127.0.0.1", "127.1.2.3", "[::1]"] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in ["example.com", "10.0.0.1", "[fe80::1]"] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn the_ruleset_isolates_task_interfaces() {
        let r = ruleset(&[]);
        assert!(
            r.contains("10.0.0.0/8") && r.contains("172.16.0.0/12"),
            "no neighbour"
        );
        let open = ruleset(&[(Ipv4Addr::new(10, 9, 0, 0), 16)]);
        assert!(open.contains("ip daddr { 10.9.0.0/16 } accept"));
        assert!(r.contains("iifname \"adlh*\" oifname \"adlh*\" drop"));
        assert!(r.contains("iifname \"adlh*\" drop"), "no host service");
        assert!(r.contains("169.254.0.0/16"), "no metadata service");
        assert!(r.contains("masquerade"));
    }
}
