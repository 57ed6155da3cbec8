#!/usr/bin/env bash
# Tunnels through the server (shell, exec and port-forward share them), timed against the
# debug server `scripts/run.sh` serves: opening one, the round trip of a small message direct
# and through it (what it adds), and an echoed stream's throughput.
#   scripts/bench-tunnel.sh [--round-trips N] [--megabytes M] [--opens K]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
build_server
PYVENV="${AUTODL_CACHE_DIR:-$HOME/.cache/autodl}/pyvenv"
[ -x "$PYVENV/bin/python" ] || python3 -m venv "$PYVENV"
"$PYVENV/bin/pip" install --quiet --disable-pip-version-check -e "clients/python[test]"
AUTODL_SERVER_BIN="$CARGO_TARGET_DIR/debug/autodl-server" "$PYVENV/bin/python" clients/python/bench/tunnel.py "$@"
