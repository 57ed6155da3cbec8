#!/usr/bin/env bash
# A gang forming on the debug server `scripts/run.sh` serves: seconds from submitting a
# 4-worker DDP task (Debian's python3-torch, gloo) to the first training step of all ranks.
#   scripts/bench-gang.sh [--runs N] [--workers W]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
apt_install python3-torch
build_server
PYVENV="${AUTODL_CACHE_DIR:-$HOME/.cache/autodl}/pyvenv"
[ -x "$PYVENV/bin/python" ] || python3 -m venv "$PYVENV"
"$PYVENV/bin/pip" install --quiet --disable-pip-version-check -e "clients/python[test]"
AUTODL_SERVER_BIN="$CARGO_TARGET_DIR/debug/autodl-server" "$PYVENV/bin/python" clients/python/bench/gang.py "$@"
