#!/usr/bin/env bash
# Benchmark (not a test): the in-process filesystem wiper against `rm -rf DIR/*` on the same
# tree (default 200,000 small files in 200 leaf directories, two levels deep), each on its own
# tmpfs. Needs root. Prints a JSON line and a readable table; never fails on timing.
# Usage: bench/wipe-fs.sh [files]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
files=${1:-200000}
[[ $(id -u) == 0 ]] || { echo "wipe-fs: needs root (mounts)" >&2; exit 1; }
cd "$repo"
out=$(WIPE_BENCH_FILES=$files cargo test --release --locked -q --test host -- --ignored --nocapture --exact wipe_fs::bench_wipe_vs_rm 2>&1) \
  || { echo "$out" >&2; exit 1; }
grep -E '^\{"figure"|^(figure|wipe_fs) ' <<< "$out"
