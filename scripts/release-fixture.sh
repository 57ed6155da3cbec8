#!/usr/bin/env bash
# Makes the databases the upgrade test starts from: a released server binary (built from the
# release's commit) writes accounts, keys, quotas, a node and tasks through its own API, on
# SQLite and on PostgreSQL; the SQLite file and a plain SQL dump of the PostgreSQL database go
# to server/tests/fixtures/ with what the test needs to know (fixture.json).
#
#   git worktree add /tmp/prev <release commit>
#   (cd /tmp/prev && CARGO_TARGET_DIR=/tmp/prev-target cargo build -p autodl-server)
#   scripts/release-fixture.sh /tmp/prev-target/debug/autodl-server <release name>
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BIN="$1"
NAME="$2"
OUT="$ROOT/server/tests/fixtures"
WORK="$(mktemp -d)"
mkdir -p "$OUT"

populate() { # $1: database URL; writes $WORK/fixture.json
  local url="$1" port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  AUTODL_DATABASE_URL="$url" AUTODL_ADMIN_PASSWORD="Upgr4de-operator!" RUST_LOG=warn \
    "$BIN" admin create-admin --email root@example.com
  AUTODL_DATABASE_URL="$url" AUTODL_LISTEN="127.0.0.1:$port" AUTODL_JWT_SECRET="fixture-secret-fixture-secret-123" \
    AUTODL_SITE_ROOT="$WORK/site" AUTODL_STORAGE_URL="file://$WORK/objects" RUST_LOG=warn "$BIN" serve &
  local pid=$!
  python3 - "http://127.0.0.1:$port" "$WORK/fixture.json" "$NAME" <<'PY'
import json, sys, time, urllib.request

base, out, name = sys.argv[1], sys.argv[2], sys.argv[3]

def call(method, path, body=None, token=None, ok=(200, 201, 204)):
    req = urllib.request.Request(base + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json", **({"authorization": "Bearer " + token} if token else {})})
    with urllib.request.urlopen(req) as r:
        assert r.status in ok, (path, r.status)
        text = r.read()
        return json.loads(text) if text else None

for _ in range(100):
    try:
        call("GET", "/healthz"); break
    except Exception:
        time.sleep(0.2)
op = call("POST", "/api/v1/auth/login", {"email": "root@example.com", "password": "Upgr4de-operator!"})["token"]
call("POST", "/api/v1/admin/nodes", {"id": "node-old", "zone": "z1", "cpu": 64, "memory": "512GiB",
     "gpus": {"type": "A100-40G", "count": 4, "memory": "40GiB"}}, op)
ada = call("POST", "/api/v1/auth/signup", {"email": "ada@example.com", "password": "Upgr4de-researcher!", "tenant_name": "Old Lab"})
tok = ada["token"]
key = call("POST", "/api/v1/api-keys", {"name": "ci"}, tok)["key"]
call("PUT", f"/api/v1/admin/tenants/{ada['user']['tenant_id']}/quota", {"max_gpus": 4, "gpu_hours_per_month": 100}, op)
inv = call("POST", "/api/v1/tenant/invitations", {"email": "bob@example.com", "role": "admin"}, tok)
call("POST", "/api/v1/auth/signup", {"email": "bob@example.com", "password": "Upgr4de-researcher!", "invitation": inv["token"]})
tasks = []
for n in ("kept", "cancelled"):
    t = call("POST", "/api/v1/tasks", {"name": n, "image": "busybox", "command": "sleep 60",
             "resources": {"gpu": {"count": 1}}}, tok)
    tasks.append(t["id"])
call("POST", f"/api/v1/tasks/{tasks[1]}/cancel", {}, tok)
json.dump({"release": name, "operator": {"email": "root@example.com", "password": "Upgr4de-operator!"},
           "researcher": {"email": "ada@example.com", "password": "Upgr4de-researcher!", "api_key": key,
                          "tenant_id": ada["user"]["tenant_id"]},
           "member": "bob@example.com", "node": "node-old",
           "tasks": {"kept": tasks[0], "cancelled": tasks[1]},
           "tenant_quota": {"max_gpus": 4, "gpu_hours_per_month": 100}}, open(out, "w"), indent=2)
PY
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

populate "sqlite://$WORK/autodl.db"
rm -f "$OUT/release.sqlite"
python3 -c 'import sys, sqlite3; sqlite3.connect(sys.argv[1]).execute("VACUUM INTO ?", (sys.argv[2],))' "$WORK/autodl.db" "$OUT/release.sqlite"
cp "$WORK/fixture.json" "$OUT/release-sqlite.json"

start_postgres
trap 'stop_postgres' EXIT
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
"$PGBIN/psql" "$AUTODL_TEST_PG_URL/postgres" -qc "CREATE DATABASE fixture"
populate "$AUTODL_TEST_PG_URL/fixture"
"$PGBIN/pg_dump" --no-owner --no-privileges "$AUTODL_TEST_PG_URL/fixture" > "$OUT/release.pg.sql"
cp "$WORK/fixture.json" "$OUT/release-postgres.json"
rm -rf "$WORK"
echo "fixtures for $NAME in $OUT"
