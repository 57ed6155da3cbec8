#!/usr/bin/env bash
# Times cold builds of the server at a revision (default: the working tree's HEAD) in a
# throwaway checkout and target folder, crates already downloaded: the debug build that
# `scripts/run.sh` serves and a release build, each with `cargo build --timings`, then lists
# the ten crates that took longest. Figures: docs/benchmarks.md.
#   scripts/bench-build.sh [REV]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
REV="${1:-HEAD}"
WORK=/tmp/autodl-bench-build
rm -rf "$WORK" && mkdir -p "$WORK"
trap 'git -C "$ROOT" worktree remove --force "$WORK/src" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
git -C "$ROOT" worktree add --detach "$WORK/src" "$REV" >/dev/null 2>&1
cd "$WORK/src"
echo "revision: $(git rev-parse --short HEAD)"
for profile in dev release; do
  export CARGO_TARGET_DIR="$WORK/target-$profile"
  t0=$(date +%s)
  cargo build -q --locked -p autodl-server --profile "$profile" --timings
  t1=$(date +%s)
  echo "server ($profile, demo feature): $((t1 - t0)) s"
  python3 - "$CARGO_TARGET_DIR/cargo-timings/cargo-timing.html" <<'PY'
import json, re, sys
html = open(sys.argv[1]).read()
units = json.loads(re.search(r"const UNIT_DATA = (\[.*?\]);\n", html, re.S).group(1))
total = {}
for u in units:
    key = f"{u['name']} {u['version']}"
    total[key] = total.get(key, 0) + u["duration"]
for name, secs in sorted(total.items(), key=lambda kv: -kv[1])[:10]:
    print(f"  {secs:6.1f} s  {name}")
PY
done
