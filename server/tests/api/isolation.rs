//! An attacker with an ordinary account on a shared host: organization B's task tries to reach
//! organization A's running task, the agent and the server through the host, on every runtime
//! the platform offers for shared use (the process runtime sandboxed, the process runtime as a
//! task uid without namespaces, and Docker). Every attempt must fail and A's data stay as it
//! was. Isolation needs root; the suite runs as root in CI.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use autodl_agent::{DockerRuntime, IsolationConfig, IsolationLevel, ProcessRuntime, Runtime};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::e2e::{log_text, start_agent_with, submit, wait_for};
use crate::helpers::{spawn_app, Backend, Session, TestApp};

crate::on_both_backends!(
    tasks_of_another_organization_reach_nothing_on_the_host,
    dataset_roots_are_read_only_and_links_stay_inside,
);

/// The store plays no part in what a task can reach on its host: one backend suffices.
#[tokio::test]
async fn a_task_racing_the_agent_s_saves_takes_nothing_of_the_host() {
    for (mode, runtime, image) in runtimes().await {
        race_on(mode, runtime, &image).await;
    }
}

/// The runtimes to attack, with how a task names its image under them.
pub(crate) async fn runtimes() -> Vec<(&'static str, Arc<dyn Runtime>, String)> {
    if !autodl_agent::isolation::is_root() {
        crate::helpers::skip("isolating tasks needs root (CI runs the suite as root)");
        return Vec::new();
    }
    let sandbox = ProcessRuntime::detect(&IsolationConfig::default()).unwrap();
    assert_eq!(
        sandbox.isolation(),
        IsolationLevel::Sandbox,
        "bubblewrap, iproute2 or nsenter is missing (scripts/test.sh installs them)"
    );
    // Without bubblewrap the process runtime still gives every task its own uid.
    let uid_only = ProcessRuntime::detect(&IsolationConfig {
        bwrap: Some(PathBuf::from("/nonexistent/bwrap")),
        ..IsolationConfig::default()
    })
    .unwrap();
    // Shared between organizations only where /proc hides other users' processes.
    let shared = autodl_agent::isolation::proc_hides_processes();
    assert_eq!(
        uid_only.isolation(),
        if shared {
            IsolationLevel::Uid
        } else {
            IsolationLevel::None
        }
    );
    let mut out: Vec<(&'static str, Arc<dyn Runtime>, String)> = vec![
        ("sandbox", Arc::new(sandbox), "none".into()),
        ("uid", Arc::new(uid_only), "none".into()),
    ];
    match std::env::var("AUTODL_TEST_DOCKER_IMAGE") {
        Ok(image) => {
            let docker = DockerRuntime::connect().await.expect("Docker engine");
            out.push(("docker", Arc::new(docker), image));
        }
        Err(_) => crate::helpers::skip(
            "the Docker part: AUTODL_TEST_DOCKER_IMAGE is not set (scripts/test.sh sets it)",
        ),
    }
    out
}

/// Lets every organization use the node even where it is trusted-only (a uid node whose
/// /proc shows every command line): an administrator who accepts that, so that every other
/// defence of such a node is still attacked.
pub(crate) async fn share(app: &TestApp, op: &Session, node: &str) {
    let nodes = op.get(app, "/api/v1/nodes").await;
    if nodes.as_array().is_some_and(|l| {
        l.iter()
            .any(|n| n["id"] == node && n["trusted_only"] == false)
    }) {
        return;
    }
    let res = op
        .send(
            app,
            Method::POST,
            &format!("/api/v1/admin/nodes/{node}/open-to-all"),
            None,
        )
        .await;
    assert!(res.status().is_success(), "{}", res.status());
    // Placed on once the scheduler has read the change.
    for _ in 0..50 {
        let nodes = op.get(app, "/api/v1/nodes").await;
        if nodes.as_array().is_some_and(|l| {
            l.iter()
                .any(|n| n["id"] == node && n["trusted_only"] == false)
        }) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{node} stayed trusted-only");
}

fn settings_path(url: &str, scheme: &str) -> String {
    url.strip_prefix(scheme).unwrap_or_default().to_owned()
}

/// Everything B's task tries. It prints `LEAK ...` for each attempt that succeeds.
const ATTACK: &str = r#"
leak() { echo "LEAK $1"; }
echo "uid=$(id -u)"
for f in "$A_DIR/results/secret.txt" "$A_DIR/checkpoints/ckpt.txt" "$A_DIR/.autodl-env" "$STATE/credential.json" "$DB" "$OBJ"; do
  if [ -n "$f" ] && cat "$f" >/dev/null 2>&1; then leak "read $f"; fi
done
ls "$A_DIR" >/dev/null 2>&1 && leak "listed A's task folder"
ls "$STATE/tasks" >/dev/null 2>&1 && leak "listed the agent's task folders"
echo tampered > "$A_DIR/results/secret.txt" 2>/dev/null && leak "wrote A's results"
for e in /proc/[0-9]*/environ; do
  if tr '\0' '\n' < "$e" 2>/dev/null | grep -q "AUTODL_TASK_ID=$A_ID"; then leak "read A's environment in $e"; fi
done
env | grep -q -e AUTODL_TEST_PG_URL -e CARGO_ -e RUST_LOG -e DOCKER_HOST && leak "the agent's environment"
for s in /var/run/docker.sock /run/docker.sock "$DOCKER_SOCK"; do
  [ -n "$s" ] && [ -e "$s" ] && leak "sees $s"
done
grep -e CapEff -e NoNewPrivs /proc/self/status
echo attack-done
"#;

async fn tasks_of_another_organization_reach_nothing_on_the_host(b: Backend) {
    for (mode, runtime, image) in runtimes().await {
        attack_on(b, mode, runtime, &image).await;
    }
}

async fn attack_on(b: Backend, mode: &str, runtime: Arc<dyn Runtime>, image: &str) {
    let app = spawn_app(b).await;
    let op = app.operator().await;
    // One node id per backend: a Docker agent starting removes containers its node id left
    // behind, and both backends' tests share one engine.
    let node = format!("shared-host-{b:?}").to_lowercase();
    let agent = start_agent_with(&app, &op, &node, "2xA100-40G", runtime, &[]).await;
    share(&app, &op, &node).await;
    let a = app.signup("a@example.com", "Org A").await;
    let bee = app.signup("b@example.com", "Org B").await;

    // A's data: an uploaded object, and a running task's results and checkpoint.
    let res = a
        .request(
            &app,
            Method::PUT,
            "/api/v1/objects/autodl/datasets/secret.bin",
        )
        .header("Content-Type", "application/octet-stream")
        .body("A-SECRET-OBJECT")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let a_id = submit(&app, &a, json!({"name": "a", "image": image,
        "command": "echo A-SECRET-RESULT > \"$AUTODL_RESULTS_DIR/secret.txt\"; echo A-SECRET-CKPT > \"$AUTODL_CHECKPOINT_DIR/ckpt.txt\"; echo ready; sleep 120",
        "resources": {"gpu": {"count": 1}}})).await;
    let a_dir = agent.state_dir.join("tasks").join(&a_id);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !a_dir.join("results/secret.txt").exists() {
        assert!(
            Instant::now() < deadline,
            "[{mode}] A's task never wrote its results"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // B knows every path (the worst case) and tries them all.
    let settings = &app.state.settings;
    let db = settings_path(&settings.database_url, "sqlite://");
    let objects = Path::new(&settings_path(&settings.storage_url, "file://")).to_path_buf();
    let obj = walk_for(&objects, "secret.bin")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    assert!(!obj.is_empty(), "A's object is on disk");
    let docker_sock = std::env::var("DOCKER_HOST")
        .unwrap_or_default()
        .trim_start_matches("unix://")
        .to_owned();
    let b_id = submit(&app, &bee, json!({"name": "b", "image": image, "command": ATTACK,
        "env": {"A_DIR": a_dir.display().to_string(), "A_ID": a_id, "STATE": agent.state_dir.display().to_string(),
                "DB": db, "OBJ": obj, "DOCKER_SOCK": docker_sock},
        "resources": {"gpu": {"count": 1}}})).await;
    let t = wait_for(&app, &bee, &b_id, &["completed", "failed"], 90).await;
    let out = log_text(&app, &bee, &b_id).await;
    assert_eq!(t["state"], "completed", "[{mode}] {t}\n{out}");
    assert!(out.contains("attack-done"), "[{mode}] {out}");
    assert!(!out.contains("LEAK"), "[{mode}] B reached something: {out}");
    assert!(!out.contains("A-SECRET"), "[{mode}] {out}");
    assert!(
        !out.contains("uid=0\n") && !out.ends_with("uid=0"),
        "[{mode}] B ran as root: {out}"
    );
    assert!(
        out.contains("CapEff:\t0000000000000000"),
        "[{mode}] B holds capabilities: {out}"
    );
    if mode != "uid" {
        assert!(out.contains("NoNewPrivs:\t1"), "[{mode}] {out}");
    }

    // A's data is as A left it.
    assert_eq!(
        std::fs::read_to_string(a_dir.join("results/secret.txt")).unwrap(),
        "A-SECRET-RESULT\n"
    );
    let res = a
        .send(
            &app,
            Method::GET,
            "/api/v1/objects/autodl/datasets/secret.bin",
            None,
        )
        .await;
    assert_eq!(res.text().await.unwrap(), "A-SECRET-OBJECT");
    let a_now = a.get(&app, &format!("/api/v1/tasks/{a_id}")).await;
    assert_eq!(
        a_now["state"], "running",
        "[{mode}] A's task was disturbed: {a_now}"
    );
    cancel(&app, &a, &a_id).await;
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

async fn cancel(app: &TestApp, s: &Session, id: &str) {
    let res = s
        .send(
            app,
            Method::POST,
            &format!("/api/v1/tasks/{id}/cancel"),
            None,
        )
        .await;
    assert!(res.status().is_success(), "cancel {id}: {}", res.status());
    wait_for(app, s, id, &["cancelled", "completed", "failed"], 30).await;
}

fn walk_for(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(found) = walk_for(&p, name) {
                return Some(found);
            }
        } else if p.file_name().is_some_and(|n| n == name) {
            return Some(p);
        }
    }
    None
}

async fn dataset_roots_are_read_only_and_links_stay_inside(b: Backend) {
    for (mode, runtime, image) in runtimes().await {
        datasets_on(b, mode, runtime, &image).await;
    }
}

async fn datasets_on(b: Backend, mode: &str, runtime: Arc<dyn Runtime>, image: &str) {
    let shared = tempfile::tempdir().unwrap();
    // Traversable by every task user, as a shared dataset folder on a host is.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = shared.path().join("datasets");
    std::fs::create_dir_all(root.join("pets")).unwrap();
    std::fs::write(root.join("pets/labels.txt"), "cat\ndog\n").unwrap();
    std::fs::create_dir_all(shared.path().join("private")).unwrap();
    std::fs::write(shared.path().join("private/secret.txt"), "HOST-SECRET").unwrap();
    std::os::unix::fs::symlink(shared.path().join("private"), root.join("escape")).unwrap();
    for p in [&root, &root.join("pets")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(
        root.join("pets/labels.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();

    let app = spawn_app(b).await;
    let op = app.operator().await;
    let node = format!("data-host-{b:?}").to_lowercase();
    let agent = start_agent_with(
        &app,
        &op,
        &node,
        "1xA100-40G",
        runtime,
        std::slice::from_ref(&root),
    )
    .await;
    share(&app, &op, &node).await;
    let s = app.signup("ada@example.com", "Lab").await;
    let path = |p: &Path| p.display().to_string();

    let read = submit(&app, &s, json!({"name": "read", "image": image, "data_path": path(&root.join("pets")),
        "command": "cat \"$AUTODL_DATA_PATH/labels.txt\"; (echo x > \"$AUTODL_DATA_PATH/new.txt\") 2>/dev/null && echo LEAK-write; echo done"})).await;
    let t = wait_for(&app, &s, &read, &["completed", "failed"], 60).await;
    let out = log_text(&app, &s, &read).await;
    assert_eq!(t["state"], "completed", "[{mode}] {t}\n{out}");
    // Docker logs each line as it reads it from either stream, so the two files' lines are
    // checked one by one rather than as a block another stream could split.
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.contains(&"cat") && lines.contains(&"dog"),
        "[{mode}] {out}"
    );
    assert!(
        !out.contains("LEAK"),
        "[{mode}] the dataset is writable: {out}"
    );
    assert!(!root.join("pets/new.txt").exists());

    // A link inside the root that points out of it is refused by the agent: the task fails
    // with the reason, and nothing of the linked folder reaches it.
    let escape = submit(
        &app,
        &s,
        json!({"name": "escape", "image": image, "data_path": path(&root.join("escape")),
        "command": "cat \"$AUTODL_DATA_PATH/secret.txt\""}),
    )
    .await;
    let t = wait_for(&app, &s, &escape, &["completed", "failed"], 60).await;
    let out = log_text(&app, &s, &escape).await;
    assert_eq!(t["state"], "failed", "[{mode}] {t}\n{out}");
    assert!(
        out.contains("not an existing folder inside a dataset root"),
        "[{mode}] {out}"
    );
    assert!(!out.contains("HOST-SECRET"), "[{mode}] {out}");
    // Paths outside every root never get as far as an agent.
    for p in ["/var/run/docker.sock", "/"] {
        let res = s
            .send(
                &app,
                Method::POST,
                "/api/v1/tasks",
                Some(json!({"name": "x", "image": image, "command": "true", "data_path": p})),
            )
            .await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "[{mode}] {p}");
        let e: Value = res.json().await.unwrap();
        assert_eq!(e["error"]["field"], "data_path");
    }
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

/// The task swaps the folders the agent is saving for links to a root-only folder of the
/// host, between the agent's listing and its taking of the files, again and again (atomically,
/// with `renameat2(RENAME_EXCHANGE)`, where Python is at hand), with a decoy of the secret's
/// name, size and time. Every save is asked for by the task itself.
const RACE: &str = r#"
export TZ=UTC0
for d in "$AUTODL_CHECKPOINT_DIR" "$AUTODL_RESULTS_DIR"; do
  mkdir -p "$d/sub"
  printf '%s' "$DECOY" > "$d/sub/credential.json"
  touch -t "$STAMP" "$d/sub/credential.json"
  ln -s "$TARGET" "$d/lnk"
done
if command -v python3 >/dev/null 2>&1; then
python3 - <<'PY'
import ctypes, os, threading, time
libc = ctypes.CDLL(None, use_errno=True)
stop = False
def swap(d):
    a, b = (d + "/sub").encode(), (d + "/lnk").encode()
    while not stop:
        libc.renameat2(-100, a, -100, b, 2)
dirs = [os.environ["AUTODL_CHECKPOINT_DIR"], os.environ["AUTODL_RESULTS_DIR"]]
threads = [threading.Thread(target=swap, args=(d,)) for d in dirs]
for t in threads: t.start()
for i in range(24):
    with open(dirs[0] + "/.autodl-save", "w") as f: f.write("{}")
    time.sleep(0.6)
stop = True
for t in threads: t.join()
PY
else
  i=0
  while [ $i -lt 3000 ]; do
    for d in "$AUTODL_CHECKPOINT_DIR" "$AUTODL_RESULTS_DIR"; do
      mv "$d/sub" "$d/sub.real" && ln -s "$TARGET" "$d/sub" && rm -f "$d/sub" && mv "$d/sub.real" "$d/sub"
    done
    [ $((i % 100)) -eq 0 ] && echo '{}' > "$AUTODL_CHECKPOINT_DIR/.autodl-save"
    i=$((i+1))
  done
fi
echo race-done
"#;

async fn race_on(mode: &str, runtime: Arc<dyn Runtime>, image: &str) {
    let app = spawn_app(Backend::Sqlite).await;
    let op = app.operator().await;
    let node = format!("race-host-{mode}");
    let agent = start_agent_with(&app, &op, &node, "1xA100-40G", runtime, &[]).await;
    share(&app, &op, &node).await;
    // A root-only folder of the host holding a secret, as the node's own credential is.
    let secret_dir = agent.state_dir.join("cache").join("host-secret");
    std::fs::create_dir_all(&secret_dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let secret = "HOST-ROOT-ONLY-SECRET-0123456789";
    let file = secret_dir.join("credential.json");
    std::fs::write(&file, secret).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let when = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(when)
        .unwrap();
    let s = app.signup("mallory@example.com", "Mallory Lab").await;
    let id = submit(
        &app,
        &s,
        json!({"name": "race", "image": image, "command": RACE,
        "env": {"TARGET": secret_dir.display().to_string(), "DECOY": "x".repeat(secret.len()),
                "STAMP": "202311142213.20"}}),
    )
    .await;
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 180).await;
    let out = log_text(&app, &s, &id).await;
    assert_eq!(t["state"], "completed", "[{mode}] {t}\n{out}");
    assert!(out.contains("race-done"), "[{mode}] {out}");
    let saves = s
        .get(&app, &format!("/api/v1/tasks/{id}/checkpoints"))
        .await;
    assert!(
        saves.as_array().is_some_and(|c| !c.is_empty()),
        "[{mode}] the race asked for saves that never happened: {saves}\n{out}"
    );
    // Nothing stored for anyone holds the secret.
    let storage = PathBuf::from(settings_path(&app.state.settings.storage_url, "file://"));
    for e in walkdir::WalkDir::new(&storage) {
        let e = e.unwrap();
        if e.file_type().is_file() {
            let bytes = std::fs::read(e.path()).unwrap();
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "[{mode}] the host's secret was saved as {}",
                e.path().display()
            );
        }
    }
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

/// Organization B's task tries the network of its host: A's app port on the loopback, a
/// root-only service on the host's loopback, a service of the host on its other addresses,
/// the addresses task networks are given, and a cloud's metadata address. It must reach none
/// of them, list no listener but its own, and still reach the outside world (a host on a
/// network of its own, here a namespace routed from the host). A's app stays reachable
/// through the platform's tunnel, and a declared port A binds elsewhere on its own loopback
/// (127.0.0.2) never leads the tunnel to the host's service on that port.
#[tokio::test]
async fn tasks_have_networks_of_their_own() {
    for (mode, runtime, _image) in runtimes().await {
        if mode == "docker" {
            // A container has had a network of its own all along (its bridge is checked in
            // the agent's Docker tests).
            continue;
        }
        network_on(mode, runtime).await;
    }
}

/// A service answering every connection with `text`, on a thread of its own.
fn serve(listener: std::net::TcpListener, text: &'static str) {
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { return };
            use std::io::Write;
            let _ = c.write_all(text.as_bytes());
        }
    });
}

/// A host outside this one: a network namespace with an address routed from here.
struct Outside {
    name: String,
    host_if: String,
    address: String,
    /// This host's address on the link to it.
    host_address: String,
}

impl Outside {
    /// A host on the network `<prefix>.0/24` (this host is `.1` there, it is `.2`).
    fn new(n: u32, prefix: &str) -> Outside {
        Self::remove_left_by_dead_runs();
        // An address of that network already here (a host another run made, a real one)
        // would take the traffic this test sends and make its result meaningless.
        let held = std::process::Command::new("ip")
            .args(["-o", "addr", "show", "to", &format!("{prefix}.0/24")])
            .output()
            .unwrap();
        let held = String::from_utf8_lossy(&held.stdout);
        assert!(
            held.trim().is_empty(),
            "{prefix}.0/24 is already a network of this host, which this test needs: {held}"
        );
        let name = format!("autodl-outside-{}-{n}", std::process::id());
        // Named by this process too: two runs of the suite on one machine never meet.
        let pid = std::process::id() & 0xfffff;
        let (host_if, peer) = (format!("adlt{pid:x}s{n}"), format!("adlt{pid:x}p{n}"));
        let ip = |args: &[&str]| {
            let ok = std::process::Command::new("ip")
                .args(args)
                .status()
                .unwrap();
            assert!(ok.success(), "ip {args:?}");
        };
        ip(&["netns", "add", &name]);
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &peer,
        ]);
        ip(&["link", "set", &peer, "netns", &name]);
        ip(&["addr", "add", &format!("{prefix}.1/24"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        ip(&[
            "-n",
            &name,
            "addr",
            "add",
            &format!("{prefix}.2/24"),
            "dev",
            &peer,
        ]);
        ip(&["-n", &name, "link", "set", &peer, "up"]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        ip(&[
            "-n",
            &name,
            "route",
            "add",
            "default",
            "via",
            &format!("{prefix}.1"),
        ]);
        Outside {
            name,
            host_if,
            address: format!("{prefix}.2"),
            host_address: format!("{prefix}.1"),
        }
    }

    /// Hosts of runs that were killed before they could remove them: a namespace gone takes
    /// its end of the link, and the host's end, with it.
    fn remove_left_by_dead_runs() {
        let Ok(names) = std::fs::read_dir("/run/netns") else {
            return;
        };
        for entry in names.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix("autodl-outside-")
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::process::Command::new("ip")
                    .args(["netns", "del", &name])
                    .status();
            }
        }
    }

    fn listen(&self) -> std::net::TcpListener {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.name)).unwrap();
        let addr = format!("{}:0", self.address);
        autodl_agent::isolation::network::inside(&ns, || std::net::TcpListener::bind(addr)).unwrap()
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

const PROBE: &str = r#"
import os, socket
def grab(host, port):
    try:
        s = socket.create_connection((host, int(port)), timeout=2)
        s.sendall(b"GET /secret.txt HTTP/1.0\r\n\r\n")
        data = s.recv(4096).decode(errors="replace")
        s.close()
        return data
    except Exception as e:
        return "refused " + type(e).__name__
env = os.environ
targets = [("A's app on the loopback", "127.0.0.1", env["A_PORT"]),
           ("the host's loopback service", "127.0.0.1", env["HOST_PORT"]),
           ("the host's service on its outside address", env["HOST_ADDR"], env["ANY_PORT"]),
           ("the metadata address", "169.254.169.254", "80"),
           ("a neighbour on a private network", env["NEAR_ADDR"], env["NEAR_PORT"])]
targets += [("a task network address", "10.213.0.%d" % (4 * i + d), p)
            for i in range(8) for d in (1, 2) for p in (env["A_PORT"], env["ANY_PORT"])]
for name, host, port in targets:
    got = grab(host, port)
    if "SECRET" in got:
        print("LEAK", name, host, port, got)
print("OUTSIDE", grab(env["OUT_ADDR"], env["OUT_PORT"]))
ports = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        cols = line.split()
        if cols[3] == "0A":
            ports.add(int(cols[1].rsplit(":", 1)[1], 16))
for p in (env["A_PORT"], env["HOST_PORT"], env["ANY_PORT"]):
    if int(p) in ports:
        print("LEAK sees the listener on", p)
print("probe-done")
"#;

async fn network_on(mode: &str, runtime: Arc<dyn Runtime>) {
    let app = spawn_app(Backend::Sqlite).await;
    let op = app.operator().await;
    let node = format!("net-host-{mode}");
    // Without a way out this test would only say "no way out" at its end.
    assert!(
        !runtime.network().contains("loopback only"),
        "[{mode}] tasks get no way out of their networks (scripts/test.sh installs nftables): {}",
        runtime.network()
    );
    let agent = start_agent_with(&app, &op, &node, "2xA100-40G", runtime, &[]).await;
    share(&app, &op, &node).await;
    // The world (a documentation network, as public addresses are to tasks) and a neighbour
    // on a private network of the host's (another host's service, a Docker container).
    let (world, private) = if mode == "sandbox" {
        ("198.51.100", "10.77.1")
    } else {
        ("203.0.113", "10.77.2")
    };
    let n = if mode == "sandbox" { 1 } else { 2 };
    let outside = Outside::new(n, world);
    let out = outside.listen();
    let out_port = out.local_addr().unwrap().port();
    serve(out, "OUTSIDE-OK");
    let neighbour = Outside::new(n + 10, private);
    let near = neighbour.listen();
    let near_port = near.local_addr().unwrap().port();
    serve(near, "NEIGHBOUR-SECRET");
    let loopback = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host_port = loopback.local_addr().unwrap().port();
    serve(loopback, "HOST-LOOPBACK-SECRET");
    let any = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let any_port = any.local_addr().unwrap().port();
    serve(any, "HOST-ANY-SECRET");

    let a = app.signup("a@example.com", "Org A").await;
    let a_port = crate::tunnels::free_port();
    let a_id = submit(
        &app,
        &a,
        json!({"name": "app", "image": "none", "kind": "session",
        "ports": [a_port, host_port],
        "command": format!("echo A-APP-SECRET > secret.txt; python3 - <<'PY' &\n\
import socket\n\
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
s.bind(('127.0.0.2', {host_port})); s.listen(5)\n\
while True:\n\
    c, _ = s.accept(); c.sendall(b'A-OWN-SERVICE'); c.close()\n\
PY\n\
exec python3 -m http.server {a_port} --bind 0.0.0.0"),
        "resources": {"gpu": {"count": 1}}}),
    )
    .await;
    wait_for(&app, &a, &a_id, &["running"], 60).await;

    // A's app through the tunnel, once it listens.
    let mut page = String::new();
    for _ in 0..50 {
        let mut ws =
            crate::tunnels::connect(&app, &a, &format!("/api/v1/tasks/{a_id}/ports/{a_port}"))
                .await
                .unwrap();
        use futures_util::{SinkExt, StreamExt};
        ws.send(tokio_tungstenite::tungstenite::Message::binary(
            b"GET /secret.txt HTTP/1.0\r\n\r\n".to_vec(),
        ))
        .await
        .unwrap();
        page.clear();
        while let Ok(Some(Ok(m))) = tokio::time::timeout(Duration::from_secs(5), ws.next()).await {
            match m {
                tokio_tungstenite::tungstenite::Message::Binary(b) => {
                    page.push_str(&String::from_utf8_lossy(&b))
                }
                tokio_tungstenite::tungstenite::Message::Close(_) => break,
                _ => {}
            }
        }
        if page.contains("A-APP-SECRET") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        page.contains("A-APP-SECRET"),
        "[{mode}] A's app through its tunnel: {page}"
    );
    // The declared port that is the host's loopback service's: the tunnel reaches A's own
    // loopback only, where nothing listens on 127.0.0.1 for it.
    let mut ws =
        crate::tunnels::connect(&app, &a, &format!("/api/v1/tasks/{a_id}/ports/{host_port}"))
            .await
            .unwrap();
    let ended = crate::tunnels::read_to_end(&mut ws, 10).await;
    assert!(
        !format!("{ended:?}").contains("HOST-LOOPBACK-SECRET"),
        "[{mode}] the tunnel led to the host's service: {ended:?}"
    );

    let bee = app.signup("b@example.com", "Org B").await;
    let b_id = submit(
        &app,
        &bee,
        json!({"name": "probe", "image": "none",
        "command": ["python3", "-c", PROBE],
        "env": {"A_PORT": a_port.to_string(), "HOST_PORT": host_port.to_string(),
                "ANY_PORT": any_port.to_string(), "HOST_ADDR": outside.host_address,
                "OUT_ADDR": outside.address, "OUT_PORT": out_port.to_string(),
                "NEAR_ADDR": neighbour.address, "NEAR_PORT": near_port.to_string()},
        "resources": {"gpu": {"count": 1}}}),
    )
    .await;
    let t = wait_for(&app, &bee, &b_id, &["completed", "failed"], 120).await;
    let out = log_text(&app, &bee, &b_id).await;
    assert_eq!(t["state"], "completed", "[{mode}] {t}\n{out}");
    assert!(out.contains("probe-done"), "[{mode}] {out}");
    assert!(!out.contains("LEAK"), "[{mode}] B reached something: {out}");
    assert!(
        out.contains("OUTSIDE OUTSIDE-OK"),
        "[{mode}] no way out to the world: {out}"
    );
    cancel(&app, &a, &a_id).await;
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

/// A task asking for 256 MiB and one CPU is held to them on a shared node: it cannot grow
/// past its memory (the kernel kills it, and the attempt says it ran out of memory) nor fork
/// past the node's process limit, and it sees its own CPU quota.
#[tokio::test]
async fn a_task_is_held_to_what_it_asked_for() {
    if !autodl_agent::isolation::is_root() {
        crate::helpers::skip("limits need root (CI runs the suite as root)");
        return;
    }
    for bwrap in [None, Some(PathBuf::from("/nonexistent/bwrap"))] {
        let config = IsolationConfig {
            bwrap: bwrap.clone(),
            pids_limit: 64,
            ..IsolationConfig::default()
        };
        let runtime = ProcessRuntime::detect(&config).unwrap();
        let mode = runtime.isolation().as_str();
        assert!(
            runtime.describe_limits().starts_with("cgroup"),
            "[{mode}] {}",
            runtime.describe_limits()
        );
        limits_on(mode, Arc::new(runtime)).await;
    }
}

const GREEDY: &str = r#"
import subprocess, time
procs = []
try:
    for i in range(200):
        procs.append(subprocess.Popen(["sleep", "30"]))
except OSError as e:
    print("fork refused:", type(e).__name__)
print("PROCS", len(procs))
for p in procs:
    p.kill()
    p.wait()
for f in ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
    try:
        print("CPU", open(f).read().strip())
    except OSError:
        pass
blocks = []
for i in range(64):
    blocks.append(bytearray(32 << 20))
    print("MB", (i + 1) * 32, flush=True)
print("survived")
"#;

async fn limits_on(mode: &str, runtime: Arc<dyn Runtime>) {
    let app = spawn_app(Backend::Sqlite).await;
    let op = app.operator().await;
    let node = format!("limits-host-{mode}");
    let agent = start_agent_with(&app, &op, &node, "1xA100-40G", runtime, &[]).await;
    share(&app, &op, &node).await;
    let s = app.signup("greedy@example.com", "Greedy Lab").await;
    let id = submit(
        &app,
        &s,
        json!({"name": "greedy", "image": "none",
        "command": ["python3", "-c", GREEDY],
        "resources": {"gpu": {"count": 1}, "cpu": 1, "memory": "256MiB"}}),
    )
    .await;
    let t = wait_for(&app, &s, &id, &["completed", "failed"], 120).await;
    let out = log_text(&app, &s, &id).await;
    assert_eq!(t["state"], "failed", "[{mode}] {t}\n{out}");
    assert!(!out.contains("survived"), "[{mode}] {out}");
    let procs: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("PROCS "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("[{mode}] {out}"));
    assert!(procs < 64, "[{mode}] {procs} processes: {out}");
    assert!(out.contains("fork refused"), "[{mode}] {out}");
    let most: u64 = out
        .lines()
        .filter_map(|l| l.strip_prefix("MB "))
        .filter_map(|n| n.trim().parse().ok())
        .max()
        .unwrap_or(0);
    assert!(most <= 256, "[{mode}] held {most} MB: {out}");
    assert!(out.contains("memory limit"), "[{mode}] {out}");
    let attempts = s.get(&app, &format!("/api/v1/tasks/{id}/attempts")).await;
    assert_eq!(attempts[0]["reason"], "oom", "[{mode}] {attempts}");
    // The node says how it limits tasks and what network they get.
    let nodes = op.get(&app, "/api/v1/nodes").await;
    let n = nodes
        .as_array()
        .and_then(|l| l.iter().find(|n| n["id"] == node.as_str()))
        .unwrap_or_else(|| panic!("[{mode}] {nodes}"));
    assert!(
        n["limits"]
            .as_str()
            .is_some_and(|l| l.starts_with("cgroup v")),
        "[{mode}] {n}"
    );
    assert!(
        n["network"]
            .as_str()
            .is_some_and(|l| l.contains("namespace per task")),
        "[{mode}] {n}"
    );
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}

/// A uid node hands uids out again, lowest first: what one organization's task left in the
/// host's shared folders must be gone before the next task of that uid, another
/// organization's, starts. And the node says it is trusted-only unless /proc hides other
/// users' command lines.
#[tokio::test]
async fn a_uid_s_leftovers_never_reach_its_next_task() {
    if !autodl_agent::isolation::is_root() {
        crate::helpers::skip("isolating tasks needs root (CI runs the suite as root)");
        return;
    }
    let locks = tempfile::tempdir().unwrap();
    // One uid, so that the second task surely gets the first one's.
    let config = IsolationConfig {
        bwrap: Some(PathBuf::from("/nonexistent/bwrap")),
        task_uids: 2_098_765..=2_098_765,
        lock_dir: locks.path().join("uids"),
        ..IsolationConfig::default()
    };
    let runtime: Arc<dyn Runtime> = Arc::new(ProcessRuntime::detect(&config).unwrap());
    let app = spawn_app(Backend::Sqlite).await;
    let op = app.operator().await;
    let node = "uid-leftovers-host";
    let agent = crate::e2e::start_agent_configured(&app, &op, node, "1xA100-40G", runtime, |c| {
        c.isolation(config.clone())
    })
    .await;
    let nodes = op.get(&app, "/api/v1/nodes").await;
    let n = nodes
        .as_array()
        .and_then(|l| l.iter().find(|n| n["id"] == node))
        .unwrap()
        .clone();
    if !autodl_agent::isolation::proc_hides_processes() {
        assert_eq!(n["trusted_only"], true, "{n}");
        share(&app, &op, node).await;
    }
    let a = app.signup("a@example.com", "Org A").await;
    let a_id = submit(&app, &a, json!({"name": "a", "image": "none",
        "command": "for d in /tmp /var/tmp /dev/shm; do echo A-LEFTOVER > $d/autodl-test-a-left; chmod 644 $d/autodl-test-a-left; mkdir -p $d/autodl-test-a-dir; echo A-LEFTOVER > $d/autodl-test-a-dir/f; done; ipcmk -M 4096 -p 0666 && ipcmk -Q -p 0666 && ipcmk -S 1 -p 0666 && echo IPC-MADE; id -u"})).await;
    let t = wait_for(&app, &a, &a_id, &["completed", "failed"], 60).await;
    let out = log_text(&app, &a, &a_id).await;
    assert_eq!(t["state"], "completed", "{t}\n{out}");
    assert!(out.contains("2098765"), "{out}");
    // System V IPC objects (the host's, without an IPC namespace) outlive their maker.
    assert!(out.contains("IPC-MADE"), "{out}");
    let bee = app.signup("b@example.com", "Org B").await;
    let b_id = submit(&app, &bee, json!({"name": "b", "image": "none",
        "command": "id -u; for d in /tmp /var/tmp /dev/shm; do cat $d/autodl-test-a-left $d/autodl-test-a-dir/f 2>/dev/null; done; echo b-done"})).await;
    let t = wait_for(&app, &bee, &b_id, &["completed", "failed"], 60).await;
    let out = log_text(&app, &bee, &b_id).await;
    assert_eq!(t["state"], "completed", "{t}\n{out}");
    assert!(out.contains("2098765"), "the same uid: {out}");
    assert!(out.contains("b-done"), "{out}");
    assert!(!out.contains("A-LEFTOVER"), "B read what A left: {out}");
    for d in ["/tmp", "/var/tmp", "/dev/shm"] {
        assert!(!Path::new(d).join("autodl-test-a-left").exists(), "{d}");
    }
    for table in ["shm", "msg", "sem"] {
        let text = std::fs::read_to_string(format!("/proc/sysvipc/{table}")).unwrap();
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        let uid = header.iter().position(|c| *c == "uid").unwrap();
        let kept: Vec<&str> = lines
            .filter(|l| l.split_whitespace().nth(uid) == Some("2098765"))
            .collect();
        assert!(
            kept.is_empty(),
            "A's {table} objects were kept for B: {kept:?}"
        );
    }
    agent.shutdown.cancel();
    let _ = agent.handle.await;
}
