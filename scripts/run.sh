#!/usr/bin/env bash
# Starts the platform on SQLite (data/autodl.db) at http://127.0.0.1:8080, with three demo
# agents on simulated GPUs (4xA100-40G, and two nodes of 2xA40) running tasks as local processes. Run as
# root, each task runs as its own uid in a bubblewrap sandbox; otherwise the demo says that
# its tasks are not isolated.
# Installs what is missing (wasm target, wasm-bindgen, bubblewrap, a Python environment with
# the SDK for demo tasks in data/python) on first use.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
# Root isolates tasks: bubblewrap, a network namespace per task (iproute2, util-linux's
# nsenter) and nftables for its way out and what it may not reach; python3-venv makes demo
# tasks' Python and the environments their requirements are installed in.
[ "$(id -u)" -ne 0 ] || apt_install bubblewrap iproute2 util-linux nftables python3-venv
build_web
build_server
# Demo tasks run on this host: their `python` is a virtualenv with the SDK, so the SDK's
# README examples (`import autodl` in train.py) run as written.
if [ -z "${AUTODL_DEMO_PYTHON:-}" ]; then
  if [ -x data/python/bin/python ] && data/python/bin/python -c 'import autodl' 2>/dev/null; then
    export AUTODL_DEMO_PYTHON="$ROOT/data/python"
  elif { [ -x data/python/bin/python ] || python3 -m venv data/python; } \
      && data/python/bin/pip install --quiet --disable-pip-version-check ./clients/python; then
    export AUTODL_DEMO_PYTHON="$ROOT/data/python"
  else
    log "could not make data/python (python3-venv missing or offline): demo tasks use the host's python3"
  fi
fi
export AUTODL_DATABASE_URL="${AUTODL_DATABASE_URL:-sqlite://data/autodl.db}"
# Sessions outlive a restart: the signing secret is made once and kept beside the database
# (readable by this user only), unless one is given.
if [ -z "${AUTODL_JWT_SECRET:-}" ]; then
  mkdir -p data
  if [ ! -s data/jwt-secret ]; then
    (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > data/jwt-secret)
  fi
  AUTODL_JWT_SECRET="$(cat data/jwt-secret)"
  export AUTODL_JWT_SECRET
fi
if [ -n "${AUTODL_ADMIN_EMAIL:-}" ] && [ -n "${AUTODL_ADMIN_PASSWORD:-}" ]; then
  "$CARGO_TARGET_DIR/debug/autodl-server" admin create-admin --email "$AUTODL_ADMIN_EMAIL"
fi
log "open http://${AUTODL_LISTEN:-127.0.0.1:8080}"
exec "$CARGO_TARGET_DIR/debug/autodl-server" serve --demo "$@"
