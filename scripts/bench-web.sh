#!/usr/bin/env bash
# Web app numbers: the gzipped size of the production bundle (wasm + JS glue + CSS, built with
# the `wasm-release` profile as the Dockerfile does) and the delay from a GPU sample reaching the
# server to the task page's chart drawing it (headless Chromium, on the debug build the tests use).
#   scripts/bench-web.sh            AUTODL_BENCH_SAMPLES=100 by default
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
command -v chromium >/dev/null || apt_install chromium
command -v node >/dev/null && command -v npm >/dev/null || apt_install nodejs npm
ensure_web_toolchain

log "building the production bundle (profile wasm-release)"
cargo build --locked -p autodl-frontend --lib --target wasm32-unknown-unknown --features hydrate --profile wasm-release
out="$(mktemp -d)"
wasm-bindgen --target web --no-typescript --remove-name-section --out-dir "$out" --out-name autodl \
  "$CARGO_TARGET_DIR/wasm32-unknown-unknown/wasm-release/autodl_frontend.wasm"
cp style/main.css "$out/autodl.css"
total=0
printf '%-16s %10s %10s\n' file bytes gzip-9
for f in autodl_bg.wasm autodl.js autodl.css; do
  raw=$(stat -c %s "$out/$f"); gz=$(gzip -9 -c "$out/$f" | wc -c); total=$((total + gz))
  printf '%-16s %10d %10d\n' "$f" "$raw" "$gz"
done
printf '%-16s %10s %10d\n' total "" "$total"
rm -rf "$out"

log "chart delay (debug build, as the browser tests run it)"
build_web
build_server
export AUTODL_SERVER_BIN="$CARGO_TARGET_DIR/debug/autodl-server"
(cd tests/browser && npm ci --no-audit --no-fund --silent && node chart-delay.bench.mjs)
