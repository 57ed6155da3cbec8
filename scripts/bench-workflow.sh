#!/usr/bin/env bash
# A researcher's first-day operations, timed against the debug server `scripts/run.sh` serves:
# a 50 MB project folder packed and uploaded as a task's workdir (and again unchanged), and a
# 200-trial sweep submitted and cancelled (seconds and HTTP requests, median of 3).
#   scripts/bench-workflow.sh [--runs N] [--megabytes M] [--trials T]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
build_server
PYVENV="${AUTODL_CACHE_DIR:-$HOME/.cache/autodl}/pyvenv"
[ -x "$PYVENV/bin/python" ] || python3 -m venv "$PYVENV"
"$PYVENV/bin/pip" install --quiet --disable-pip-version-check -e "clients/python[test]"
AUTODL_SERVER_BIN="$CARGO_TARGET_DIR/debug/autodl-server" "$PYVENV/bin/python" clients/python/bench/workflow.py "$@"
