#!/usr/bin/env bash
# Benchmark (not a test): what N wedged volumes (default 100) cost the healthy ones, issue 41's
# scenario. Runs tests/cluster/wedged_disks.rs's scenario (a) with WEDGED_VOLUMES=N: N bindfs FUSE
# mounts whose daemons are stopped (every access blocks, even stat) beside 3 healthy tmpfs
# volumes in one class, the agent (its own process, --host-op-timeout 2s) started among them;
# then a new healthy volume is mounted and a healthy one released. Prints the scenario's figures
# as a JSON line, then a table: the agent's threads and RSS at N wedged and 60 s later, the
# time to publish the healthy volumes (at start, and one mounted later), to recycle a released
# one, and the threads 30 s after the thaw (SIGCONT).
#
# Usage: bench/wedged-disks.sh [N ...]   (several N: one run each)
# The agent is a release build (BENCH_PROFILE=dev for the debug build the tests use). A control
# plane: LSP_CONTROL_PLANE_DIR if set, else the test starts and stops its own. Needs root and
# bindfs. Never fails on timing: a run whose bounds (5 s / 30 s) are missed is reported as such.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[[ $(id -u) == 0 ]] || { echo "benchmark: needs root (mounts, FUSE)" >&2; exit 1; }
command -v bindfs > /dev/null || { echo "benchmark: needs bindfs (scripts/install-deps.sh)" >&2; exit 1; }
counts=("$@")
((${#counts[@]})) || counts=(100)
profile=()
[[ ${BENCH_PROFILE:-release} == dev ]] || profile=(--release)
out=$(mktemp -t lsp-bench-wedged.XXXXXX)
trap 'rm -f "$out"' EXIT
(cd "$repo" && cargo test "${profile[@]}" --locked -q --test cluster --no-run) >&2
rows=()
for n in "${counts[@]}"; do
  verdict=met
  (cd "$repo" && WEDGED_VOLUMES=$n cargo test "${profile[@]}" --locked -q --test cluster -- \
    --exact wedged_disks::a_hundred_wedged_volumes_never_hold_the_healthy_ones --nocapture --test-threads=1) > "$out" 2>&1 \
    || verdict=missed
  line=$(grep -o -m1 '{".*"scenario":"wedged-volumes".*}' "$out" || true)
  if [[ -z $line ]]; then
    echo "wedged=$n: no figures (the scenario did not get that far); its output:" >&2
    tail -30 "$out" >&2
    continue
  fi
  echo "$line"
  rows+=("$(python3 -c '
import json, sys
f = json.loads(sys.argv[1])
s = lambda v: "-" if v is None else f"{v / 1000:.1f}"
print("|".join(str(x) for x in [f["wedged"], f["threads_at_wedged"], f["rss_kib_at_wedged"] // 1024,
      f["rss_kib_after_60s"] // 1024, s(f["healthy_published_after_start_ms"]), s(f["publish_healthy_ms"]),
      s(f["recycle_healthy_ms"]), f["threads_after_thaw_30s"], sys.argv[2]]))
' "$line" "$verdict")")
done
echo
printf '%-8s %-8s %-9s %-10s %-10s %-11s %-11s %-13s %s\n' wedged threads rss_MiB rss_60s_MiB start_s publish_s recycle_s threads_thaw bounds
for r in "${rows[@]}"; do
  IFS='|' read -r -a c <<< "$r"
  printf '%-8s %-8s %-9s %-10s %-10s %-11s %-11s %-13s %s\n' "${c[@]}"
done
