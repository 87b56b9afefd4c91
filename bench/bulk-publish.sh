#!/usr/bin/env bash
# Benchmark (not a test): N tmpfs volumes present at start (default 1000); time from agent start
# until all N PVs exist in the API, and the agent's peak memory. Needs root. Prints a JSON line
# and a readable line; never fails on timing. Extra agent flags via AGENT_ARGS. Cleans up every mount and process it made.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
n=${1:-1000}
[[ $(id -u) == 0 ]] || { echo "bulk-publish: needs root (mounts)" >&2; exit 1; }
work=$(mktemp -d -t lsp-bench-bulk.XXXXXX)
agent_pid=""
cleanup() {
  [[ -n "$agent_pid" ]] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  for v in "$work"/disks/*; do mountpoint -q "$v" && umount "$v"; done
  bash "$repo/tests/control-plane/stop.sh" "$work/cp"
  rm -rf "$work"
}
trap cleanup EXIT

(cd "$repo" && cargo build --release --locked -q)
bin=$repo/target/release/local-static-provisioner
bash "$repo/tests/control-plane/start.sh" "$work/cp" 2>/dev/null
source "$work/cp/env"
k() { "$CONTROL_PLANE_BIN/kubectl" "$@"; }
k apply -f - > /dev/null <<YAML
apiVersion: v1
kind: Node
metadata: {name: bench-node, labels: {kubernetes.io/hostname: bench-node}}
YAML
k apply -f "$repo/deploy/base/storageclass.yaml" > /dev/null
bash "$repo/tests/control-plane/agent-kubeconfig.sh" "$work/cp" "$work/agent.kubeconfig"
for i in $(seq 1 "$n"); do mkdir -p "$work/disks/v$i"; mount -t tmpfs -o size=16m tmpfs "$work/disks/v$i"; done
mkdir -p "$work/config"
printf 'fast-disks:\n  hostDir: %s\n  mountDir: %s\n' "$work/disks" "$work/disks" > "$work/config/storageClassMap"

start=$(date +%s.%N)
RUST_LOG=warn "$bin" run ${AGENT_ARGS:-} --config-dir "$work/config" --node-name bench-node --kubeconfig "$work/agent.kubeconfig" &
agent_pid=$!
while [[ $(k get pv -o name | wc -l) -lt $n ]]; do sleep 0.1; done
end=$(date +%s.%N)
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$agent_pid/status")
secs=$(python3 -c "print(round($end - $start, 2))")
echo "{\"figure\":\"bulk_publish\",\"volumes\":$n,\"seconds\":$secs,\"agent_vmhwm_kib\":$hwm}"
printf '%-14s %8s %10s %16s\n' figure volumes seconds agent_peak_MiB
printf '%-14s %8s %10s %16s\n' bulk_publish "$n" "$secs" "$(python3 -c "print(round($hwm/1024,1))")"
