#!/usr/bin/env bash
# Starts the platform on SQLite (data/autodl.db) at http://127.0.0.1:8080, with two demo
# agents on simulated GPUs (4xA100-40G and 4xA40) running tasks as local processes. Run as
# root, each task runs as its own uid in a bubblewrap sandbox; otherwise the demo says that
# its tasks are not isolated.
# Installs what is missing (wasm target, wasm-bindgen, bubblewrap) on first use.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
[ "$(id -u)" -ne 0 ] || command -v bwrap >/dev/null || apt_install bubblewrap
build_web
build_server
export AUTODL_DATABASE_URL="${AUTODL_DATABASE_URL:-sqlite://data/autodl.db}"
if [ -n "${AUTODL_ADMIN_EMAIL:-}" ] && [ -n "${AUTODL_ADMIN_PASSWORD:-}" ]; then
  "$CARGO_TARGET_DIR/debug/autodl-server" admin create-admin --email "$AUTODL_ADMIN_EMAIL"
fi
log "open http://${AUTODL_LISTEN:-127.0.0.1:8080}"
exec "$CARGO_TARGET_DIR/debug/autodl-server" serve --demo "$@"
