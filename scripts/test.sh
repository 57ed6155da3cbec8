#!/usr/bin/env bash
# Runs the whole test suite: formatting and lints, unit and API tests on SQLite and on a
# throwaway PostgreSQL, and browser tests in headless Chromium. Installs what is missing.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
started=$(date +%s)
export RUST_LOG="${RUST_LOG:-warn}"

command -v chromium >/dev/null || apt_install chromium
# Task isolation (a sandbox per task) is tested as root, with bubblewrap.
# Root isolates tasks: bubblewrap, a network namespace per task (iproute2, util-linux's
# nsenter) and nftables for its way out and what it may not reach.
[ "$(id -u)" -ne 0 ] || apt_install bubblewrap iproute2 util-linux nftables
command -v node >/dev/null && command -v npm >/dev/null || apt_install nodejs npm
# Gangs train for real: PyTorch's DDP on CPU (gloo), Debian's build; task environments are
# virtualenvs of the host's Python.
apt_install python3-torch python3-venv
ensure_web_toolchain

log "cargo fmt --check"
cargo fmt --all -- --check

build_web
log "building the agent (its binary is used by the end-to-end tests)"
cargo build --locked -p autodl-agent
log "cargo clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings
# The production build (the Dockerfile's) leaves the demo and replay harness out.
cargo clippy --locked -p autodl-server --no-default-features -- -D warnings
cargo clippy --locked -p autodl-frontend --lib --target wasm32-unknown-unknown --features hydrate -- -D warnings

start_postgres
start_docker
trap 'stop_postgres; stop_docker' EXIT

# Python for the API tests' helpers (a real SMTP server, aiosmtpd) and, later, the SDK tests.
PYVENV="${AUTODL_CACHE_DIR:-$HOME/.cache/autodl}/pyvenv"
[ -x "$PYVENV/bin/python" ] || python3 -m venv "$PYVENV"
"$PYVENV/bin/pip" install --quiet --disable-pip-version-check -r server/tests/requirements.txt
export AUTODL_TEST_PYTHON="$PYVENV/bin/python"

# A real OpenID provider (oidc-provider, from the npm registry) for the single sign-on tests.
(cd tests/oidc && npm ci --no-audit --no-fund --silent)

log "unit and API tests (SQLite and PostgreSQL)"
# A test that hangs fails the run here (saying so) rather than holding it to CI's limit.
timeout 50m cargo test --locked --workspace || {
  rc=$?
  [ "$rc" -ne 124 ] || log "unit and API tests ran past 50 minutes: a test hangs"
  exit "$rc"
}

log "browser tests (headless Chromium)"
# `cargo test` above built the server binary (integration tests need it); building it again
# without the test-only dependencies would recompile the S3 stack for nothing.
[ -x "$CARGO_TARGET_DIR/debug/autodl-server" ] || build_server
export AUTODL_SERVER_BIN="$CARGO_TARGET_DIR/debug/autodl-server"
export AUTODL_ARTIFACTS="${AUTODL_ARTIFACTS:-$ROOT/artifacts/screenshots}"
(cd tests/browser && npm ci --no-audit --no-fund --silent && node --test --test-concurrency=1 --test-force-exit --test-timeout=600000)

log "Python SDK tests (against a live server)"
"$PYVENV/bin/pip" install --quiet --disable-pip-version-check -e "clients/python[test]"
(cd clients/python && "$PYVENV/bin/python" -m pytest -q -p no:cacheprovider)

log "API fuzzing (Schemathesis against the OpenAPI document, every check)"
"$PYVENV/bin/pip" install --quiet --disable-pip-version-check -r tests/api-fuzz/requirements.txt
"$PYVENV/bin/python" tests/api-fuzz/fuzz.py --max-time "${AUTODL_FUZZ_SECONDS:-150}"

log "all tests passed in $(( $(date +%s) - started )) s (screenshots in $AUTODL_ARTIFACTS)"
