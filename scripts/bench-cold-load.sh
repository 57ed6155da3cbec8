#!/usr/bin/env bash
# Web app load times: how soon the dashboard, the task list and a task page show their data and
# become interactive in headless Chromium, cold and warm, with 10,000 tasks in the
# organization, served exactly as `scripts/run.sh` serves them.
#   scripts/bench-cold-load.sh      AUTODL_BENCH_TASKS=10000 AUTODL_BENCH_RUNS=5 by default
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
command -v chromium >/dev/null || apt_install chromium
command -v node >/dev/null && command -v npm >/dev/null || apt_install nodejs npm
build_web
build_server
export AUTODL_SERVER_BIN="$CARGO_TARGET_DIR/debug/autodl-server"
(cd tests/browser && npm ci --no-audit --no-fund --silent && node cold-load.bench.mjs)
