#!/usr/bin/env bash
# How long placement stops when the scheduler's leader is frozen (SIGSTOP) or killed: two
# servers on a throwaway PostgreSQL database, a real agent; seconds from the fault to the next
# task placed by the other server.
#   scripts/bench-failover.sh [--runs N] [--fault stop|kill]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
build_server
(cd "$ROOT" && cargo build --locked -p autodl-agent)
start_postgres
trap stop_postgres EXIT
db="failover_$$"
psql "$AUTODL_TEST_PG_URL/postgres" -qc "CREATE DATABASE $db" >/dev/null
PYVENV="${AUTODL_CACHE_DIR:-$HOME/.cache/autodl}/pyvenv"
[ -x "$PYVENV/bin/python" ] || python3 -m venv "$PYVENV"
"$PYVENV/bin/pip" install --quiet --disable-pip-version-check -e "clients/python[test]"
AUTODL_SERVER_BIN="$CARGO_TARGET_DIR/debug/autodl-server" AUTODL_AGENT_BIN="$CARGO_TARGET_DIR/debug/autodl-agent" \
  AUTODL_BENCH_PG_URL="$AUTODL_TEST_PG_URL/$db" "$PYVENV/bin/python" clients/python/bench/failover.py "$@"
