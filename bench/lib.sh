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

# watch_pvs FILE: appends "<time> <PV name>" to FILE for every PV event, in the background
# (its PID in $watch_pid); wait_pvs FILE N: until N distinct PVs have been seen.
watch_pvs() {
  k get pv --watch --no-headers -o custom-columns=NAME:.metadata.name 2>/dev/null | while read -r name; do
    echo "$(date +%s.%N) $name"
  done > "$1" &
  watch_pid=$!
}
wait_pvs() {
  until [[ $(awk '{print $2}' "$1" | sort -u | wc -l) -ge $2 ]]; do sleep 0.01; done
}

# latency STARTS SEEN FIGURE COUNT_KEY: from each line's time in STARTS to the first sighting
# of the next new PV in SEEN; prints the figure's JSON line, a space, and "n|p50|p99|max".
latency() {
  python3 - "$@" <<'PY'
import sys
starts = [float(l.split()[0]) for l in open(sys.argv[1])]
seen, firsts = set(), []
for l in open(sys.argv[2]):
    t, name = l.split()
    if name not in seen:
        seen.add(name); firsts.append(float(t))
lat = sorted(f - s for s, f in zip(starts, firsts))
q = lambda p: lat[min(len(lat) - 1, int(round(p * (len(lat) - 1))))]
print(f'{{"figure":"{sys.argv[3]}","{sys.argv[4]}":{len(lat)},"p50_s":{q(.5):.3f},"p99_s":{q(.99):.3f},"max_s":{lat[-1]:.3f}}}',
      f"{len(lat)}|{q(.5):.3f}|{q(.99):.3f}|{lat[-1]:.3f}")
PY
}

# idle_cost SECONDS: the agent's CPU seconds and share of a core over SECONDS (after 11 s of
# quiet), and its RSS in KiB at the end; sets $cpu, $pct and $rss.
idle_cost() {
  local hz t0 t1
  hz=$(getconf CLK_TCK)
  # The blocking-pool threads of the last passes end after 10 s idle: the kernel's per-process
  # utime and stime are rescaled when a thread exits, which would put part of the work done
  # before the window inside it.
  sleep 11
  t0=$(awk '{print $14 + $15}' "/proc/$agent_pid/stat")
  sleep "$1"
  t1=$(awk '{print $14 + $15}' "/proc/$agent_pid/stat")
  cpu=$(python3 -c "print(round(($t1 - $t0) / $hz, 3))")
  pct=$(python3 -c "print(round(100 * ($t1 - $t0) / $hz / $1, 4))")
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$agent_pid/status")
}

# Upstream v2.9.0's Helm chart node ClusterRole (helm/provisioner/templates/rbac.yaml), bound to
# the agent ServiceAccount besides ours so the audit log keeps attributing its requests (with
# the script's own `k`, kubectl on its control plane).
upstream_node_rbac() {
  k apply -f - > /dev/null <<'YAML'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: bench-upstream-v2.9.0}
rules:
- {apiGroups: [""], resources: ["persistentvolumes"], verbs: ["get", "list", "watch", "create", "delete"]}
- {apiGroups: ["storage.k8s.io"], resources: ["storageclasses"], verbs: ["get", "list", "watch"]}
- {apiGroups: [""], resources: ["events"], verbs: ["watch"]}
- {apiGroups: ["", "events.k8s.io"], resources: ["events"], verbs: ["create", "update", "patch"]}
- {apiGroups: [""], resources: ["nodes"], verbs: ["get", "update"]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: bench-upstream-v2.9.0}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: bench-upstream-v2.9.0}
subjects: [{kind: ServiceAccount, name: local-static-provisioner, namespace: local-static-provisioner}]
YAML
}
