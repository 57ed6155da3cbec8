#!/usr/bin/env bash
# Times a cold build of what scripts/run.sh builds, phase by phase, in throwaway folders
# (crates already downloaded: a fresh machine also downloads them). Figures: docs/benchmarks.md.
set -euo pipefail
rm -rf /tmp/cold && mkdir -p /tmp/cold
trap "rm -rf /tmp/cold" EXIT
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
export CARGO_TARGET_DIR=/tmp/cold/target AUTODL_SITE_ROOT=/tmp/cold/site
V="$(grep -A1 '^name = "wasm-bindgen"$' Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p')"
t0=$(date +%s)
cargo install -q wasm-bindgen-cli --version "$V" --root /tmp/cold/wbg
t1=$(date +%s); echo "wasm-bindgen-cli: $((t1-t0)) s"
cargo build -q --locked -p autodl-frontend --lib --target wasm32-unknown-unknown --features hydrate --profile wasm-dev
t2=$(date +%s); echo "wasm: $((t2-t1)) s"
mkdir -p /tmp/cold/site/pkg
/tmp/cold/wbg/bin/wasm-bindgen --target web --no-typescript --remove-name-section --out-dir /tmp/cold/site/pkg --out-name autodl /tmp/cold/target/wasm32-unknown-unknown/wasm-dev/autodl_frontend.wasm
t3=$(date +%s); echo "wasm-bindgen: $((t3-t2)) s"
cargo build -q --locked -p autodl-server
t4=$(date +%s); echo "server (debug): $((t4-t3)) s"
echo "total: $((t4-t0)) s"
