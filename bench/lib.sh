# Shared set-up for the benchmark scripts (sourced, not run): a fresh control plane, a fake
# Ready node, the StorageClass and the agent's ServiceAccount kubeconfig, all under $work, and
# a cleanup trap that stops the agent, unmounts $work/disks/* and stops the control plane.
# Benchmarks print figures; they never fail on timing.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[[ $(id -u) == 0 ]] || { echo "benchmark: needs root (mounts)" >&2; exit 1; }
work=$(mktemp -d -t lsp-bench.XXXXXX)
agent_pid=""
bench_cleanup() {
  [[ -n "$agent_pid" ]] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  for v in "$work"/disks/*; do mountpoint -q "$v" && umount "$v"; done
  bash "$repo/tests/control-plane/stop.sh" "$work/cp"
  rm -rf "$work"
}
trap bench_cleanup EXIT

# BENCH_BIN: a binary built beforehand (to compare two builds); otherwise a release build of
# this tree, copied under $work so a concurrent build into a shared CARGO_TARGET_DIR cannot
# swap it mid-run.
bin=$work/local-static-provisioner
if [[ -n "${BENCH_BIN:-}" ]]; then
  cp "$BENCH_BIN" "$bin"
else
  (cd "$repo" && cargo build --release --locked -q)
  cp "${CARGO_TARGET_DIR:-$repo/target}/release/local-static-provisioner" "$bin"
fi
bash "$repo/tests/control-plane/start.sh" "$work/cp" 2>/dev/null
# shellcheck disable=SC1091
source "$work/cp/env"
k() { "$CONTROL_PLANE_BIN/kubectl" "$@"; }
k apply -f - > /dev/null <<YAML
apiVersion: v1
kind: Node
metadata: {name: bench-node, labels: {kubernetes.io/hostname: bench-node}}
YAML
k patch node bench-node --subresource=status --type=merge -p \
  '{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"bench"}],"allocatable":{"cpu":"4","memory":"8Gi","pods":"110"},"capacity":{"cpu":"4","memory":"8Gi","pods":"110"}}}' > /dev/null
k patch node bench-node --type=json -p '[{"op":"remove","path":"/spec/taints"}]' > /dev/null 2>&1 || true
k apply -f "$repo/deploy/base/storageclass.yaml" > /dev/null
bash "$repo/tests/control-plane/agent-kubeconfig.sh" "$work/cp" "$work/agent.kubeconfig"
mkdir -p "$work/disks" "$work/config"
printf 'fast-disks:\n  hostDir: %s\n  mountDir: %s\n' "$work/disks" "$work/disks" > "$work/config/storageClassMap"

# start_agent [extra flags...]: runs the agent in the background as the ServiceAccount.
start_agent() {
  RUST_LOG=${RUST_LOG:-warn} "$bin" run "$@" --listen-address 127.0.0.1:0 --config-dir "$work/config" \
    --node-name bench-node --kubeconfig "$work/agent.kubeconfig" --state-dir "$work/state" &
  agent_pid=$!
}

now() { date +%s.%N; }
elapsed() { python3 -c "print(round($2 - $1, 3))"; }
