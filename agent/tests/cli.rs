//! The agent binary as an operator starts it: a host without Docker must not quietly run
//! tasks as plain processes (`--runtime auto`), and `--isolation required` must not start
//! where tasks cannot be isolated.

use std::process::Command;
use std::time::{Duration, Instant};

/// Runs the agent with `args` against a server that is not there, with no Docker engine
/// reachable; returns (exit success, stderr and stdout). The agent must exit by itself. With
/// `as_nobody`, a root test run starts it as `nobody` (a copy of the binary, as root's build
/// folder is not readable to others).
fn run_agent(args: &[&str], as_nobody: bool) -> (bool, String) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let mut cmd = if as_nobody && nix::unistd::geteuid().is_root() {
        let bin = dir.path().join("autodl-agent");
        std::fs::copy(env!("CARGO_BIN_EXE_autodl-agent"), &bin).unwrap();
        for (p, mode) in [
            (dir.path(), 0o755),
            (state.as_path(), 0o777),
            (bin.as_path(), 0o755),
        ] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(bin);
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_autodl-agent"))
    };
    let mut child = cmd
        .args(["--server", "http://127.0.0.1:9", "--simulate", "1xA40"])
        .arg("--state-dir")
        .arg(&state)
        .args(["--metrics-listen", "off"])
        .args(args)
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the agent kept running with {args:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    (out.status.success(), text)
}

#[test]
fn auto_runtime_refuses_to_start_without_docker() {
    let (ok, text) = run_agent(&[], false);
    assert!(!ok, "{text}");
    assert!(text.contains("Docker is not reachable"), "{text}");
    assert!(text.contains("--runtime process"), "{text}");
}

#[test]
fn required_isolation_refuses_to_start_without_it() {
    // Not root: tasks cannot get their own uid, so they cannot be isolated; the agent must
    // say so rather than run them as its own user.
    let (ok, text) = run_agent(&["--runtime", "process", "--isolation", "required"], true);
    assert!(!ok, "{text}");
    assert!(text.to_lowercase().contains("isolat"), "{text}");
}
