//! The server's layers point one way (README, "Inside the server"): these read its sources and
//! fail when a handler reaches the store or a module below the use cases reaches up into them.

use std::path::{Path, PathBuf};

fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            out.push((path, text));
        }
    }
    out
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn handlers_call_use_cases_never_the_store() {
    let mut found = Vec::new();
    for (path, text) in sources(&src().join("routes")) {
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            let t = code.trim();
            if code.contains("state.store") || t == ".store" || t.starts_with(".store.") {
                found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "handlers that reach the store:\n{}",
        found.join("\n")
    );
}

#[test]
fn nothing_below_the_use_cases_reaches_up_into_them() {
    // The HTTP side (routes, the apps proxy, the tunnels' relay, the wiring) calls use cases;
    // the demo and replay harness drive the platform from outside.
    let above = [
        "routes",
        "task_web",
        "tunnels/relay.rs",
        "startup.rs",
        "demo.rs",
        "replay",
    ];
    let mut found = Vec::new();
    for (path, text) in sources(&src()) {
        let rel = path
            .strip_prefix(src())
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if rel.starts_with("usecases") || above.iter().any(|a| rel.starts_with(a)) {
            continue;
        }
        if text.contains("crate::usecases") || text.contains("crate::routes") {
            found.push(rel);
        }
    }
    assert!(found.is_empty(), "modules that reach up: {found:?}");
}
