# Shared helpers for the project's scripts: tool installation and the web bundle build.
# shellcheck shell=bash

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# One build cache outside the clone, so a fresh clone (CI) reuses earlier compilations.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${AUTODL_CACHE_DIR:-$HOME/.cache/autodl}/target}"
export AUTODL_SITE_ROOT="${AUTODL_SITE_ROOT:-$CARGO_TARGET_DIR/site}"
WASM_BINDGEN_VERSION="$(grep -A1 '^name = "wasm-bindgen"$' "$ROOT/Cargo.lock" | sed -n 's/^version = "\(.*\)"/\1/p')"

log() { printf '\033[1;34m==>\033[0m %s\n' "$*" >&2; }

apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

ensure_web_toolchain() {
  if ! rustup target list --installed 2>/dev/null | grep -q wasm32-unknown-unknown; then
    log "adding the wasm32 target"
    rustup target add wasm32-unknown-unknown
  fi
  if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$WASM_BINDGEN_VERSION" ]; then
    log "installing wasm-bindgen-cli $WASM_BINDGEN_VERSION (about 2 minutes, once)"
    cargo install wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION"
  fi
}

# Builds the browser bundle (wasm + JS glue + CSS) into $AUTODL_SITE_ROOT/pkg.
# The wasm is built with `wasm-dev`: the dev profile (as the server is built) optimised for
# size; a bundle with other debug assertions than the server's would not hydrate its pages.
build_web() {
  ensure_web_toolchain
  log "building the web app (wasm)"
  (cd "$ROOT" && cargo build --locked -p autodl-frontend --lib --target wasm32-unknown-unknown --features hydrate --profile wasm-dev)
  mkdir -p "$AUTODL_SITE_ROOT/pkg"
  # Function names would be 7 of every 10 MB the browser loads.
  wasm-bindgen --target web --no-typescript --remove-name-section --out-dir "$AUTODL_SITE_ROOT/pkg" --out-name autodl \
    "$CARGO_TARGET_DIR/wasm32-unknown-unknown/wasm-dev/autodl_frontend.wasm"
  cp "$ROOT/style/main.css" "$AUTODL_SITE_ROOT/pkg/autodl.css"
  # The terminal on the task page (xterm.js, from the npm registry, pinned in web/).
  (cd "$ROOT/web" && npm ci --no-audit --no-fund --silent)
  cp "$ROOT/web/node_modules/@xterm/xterm/lib/xterm.js" "$ROOT/web/node_modules/@xterm/xterm/css/xterm.css" "$AUTODL_SITE_ROOT/pkg/"
  # Compressed once here rather than by the server on every load.
  gzip -9 -k -f "$AUTODL_SITE_ROOT/pkg/autodl_bg.wasm" "$AUTODL_SITE_ROOT/pkg/autodl.js" "$AUTODL_SITE_ROOT/pkg/autodl.css" \
    "$AUTODL_SITE_ROOT/pkg/xterm.js" "$AUTODL_SITE_ROOT/pkg/xterm.css"
}

build_server() {
  log "building the server"
  (cd "$ROOT" && cargo build --locked -p autodl-server)
}

# Starts a throwaway PostgreSQL cluster and exports AUTODL_TEST_PG_URL; stopped on exit.
start_postgres() {
  local bin
  bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
  if [ -z "$bin" ]; then
    apt_install postgresql
    bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
  fi
  PG_DIR="$(mktemp -d /tmp/autodl-pg.XXXXXX)"
  chmod 755 "$PG_DIR"
  local port=$(( 20000 + RANDOM % 20000 ))
  local as_pg=()
  if [ "$(id -u)" -eq 0 ]; then chown postgres "$PG_DIR"; as_pg=(runuser -u postgres --); fi
  "${as_pg[@]}" "$bin/initdb" -D "$PG_DIR/data" --auth=trust -U postgres >/dev/null
  "${as_pg[@]}" "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w \
    -o "-p $port -k $PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" start >/dev/null
  export AUTODL_TEST_PG_URL="postgres://postgres@127.0.0.1:$port"
  PG_STOP=("${as_pg[@]}" "$bin/pg_ctl" -D "$PG_DIR/data" -m immediate stop)
  log "PostgreSQL test cluster on port $port"
}

stop_postgres() {
  if [ -n "${PG_DIR:-}" ]; then
    "${PG_STOP[@]}" >/dev/null 2>&1 || true
    rm -rf "$PG_DIR"
  fi
}

# Starts a private Docker engine and imports a small local image (no registry is reachable):
# exports DOCKER_HOST and AUTODL_TEST_DOCKER_IMAGE; stopped on exit by stop_docker.
start_docker() {
  apt_install docker.io busybox-static
  DOCKER_DIR="$(mktemp -d /tmp/autodl-docker.XXXXXX)"
  export DOCKER_HOST="unix://$DOCKER_DIR/docker.sock"
  dockerd --data-root "$DOCKER_DIR/data" --exec-root "$DOCKER_DIR/exec" --pidfile "$DOCKER_DIR/docker.pid" \
    -H "$DOCKER_HOST" >"$DOCKER_DIR/dockerd.log" 2>&1 &
  for _ in $(seq 1 60); do
    /usr/bin/docker version >/dev/null 2>&1 && break
    sleep 0.5
  done
  if ! /usr/bin/docker version >/dev/null 2>&1; then
    log "dockerd did not start; its log:"; tail -20 "$DOCKER_DIR/dockerd.log" >&2; return 1
  fi
  local rootfs="$DOCKER_DIR/rootfs"
  mkdir -p "$rootfs/bin" "$rootfs/tmp"
  cp /bin/busybox "$rootfs/bin/busybox"
  for tool in sh echo cat sleep env ls mkdir trap printf true false grep tr id head touch wc httpd stty ln mv rm; do ln -sf busybox "$rootfs/bin/$tool"; done
  tar -C "$rootfs" -c . | /usr/bin/docker import - autodl-test:busybox >/dev/null
  export AUTODL_TEST_DOCKER_IMAGE=autodl-test:busybox
  log "Docker engine at $DOCKER_HOST with image $AUTODL_TEST_DOCKER_IMAGE"
}

stop_docker() {
  if [ -n "${DOCKER_DIR:-}" ] && [ -f "$DOCKER_DIR/docker.pid" ]; then
    kill "$(cat "$DOCKER_DIR/docker.pid")" 2>/dev/null || true
    sleep 1
    rm -rf "$DOCKER_DIR" 2>/dev/null || true
  fi
}
