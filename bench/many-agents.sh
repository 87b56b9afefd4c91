#!/usr/bin/env bash
# Benchmark (not a test): A agents (default 50, different node names) against one control
# plane, each with V tmpfs volumes (default 20). Reports the time from starting them until all
# A*V PVs exist, then the API server's request rate over IDLE_SECONDS (default 60) of idleness,
# from kube-apiserver's own apiserver_request_total. Needs root.
agents=${1:-50}
v=${2:-20}
idle=${IDLE_SECONDS:-60}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
pids=()
stop_agents() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; bench_cleanup; }
trap stop_agents EXIT
for a in $(seq 1 "$agents"); do
  k apply -f - > /dev/null <<YAML
apiVersion: v1
kind: Node
metadata: {name: node-$a, labels: {kubernetes.io/hostname: node-$a}}
YAML
  mkdir -p "$work/agent-$a/config"
  for i in $(seq 1 "$v"); do
    mkdir -p "$work/disks/a$a-v$i"
    mount -t tmpfs -o size=16m tmpfs "$work/disks/a$a-v$i"
  done
  mkdir -p "$work/agent-$a/disks"
  for i in $(seq 1 "$v"); do ln -s "$work/disks/a$a-v$i" "$work/agent-$a/disks/v$i"; done
  printf 'fast-disks:\n  hostDir: %s\n  mountDir: %s\n' "$work/agent-$a/disks" "$work/agent-$a/disks" > "$work/agent-$a/config/storageClassMap"
done
total=$((agents * v))
requests() {
  k get --raw /metrics | awk '/^apiserver_request_total\{/ {s += $NF} END {printf "%d", s}'
}
start=$(now)
for a in $(seq 1 "$agents"); do
  RUST_LOG=warn "$bin" run --listen-address 127.0.0.1:0 --config-dir "$work/agent-$a/config" \
    --node-name "node-$a" --kubeconfig "$work/agent.kubeconfig" --state-dir "$work/agent-$a/state" \
    2> "$work/agent-$a.log" &
  pids+=($!)
done
until [[ $(k get pv -o name | wc -l) -ge $total ]]; do sleep 0.2; done
secs=$(elapsed "$start" "$(now)")
# Idle means idle: wait until the PV controller has set every PV Available (it is throttled to
# 20 requests/s, so this takes about a minute for 1000 PVs).
until [[ $(k get pv --no-headers | awk '$5 == "Available"' | wc -l) -ge $total ]]; do sleep 1; done
sleep 5
r0=$(requests); sleep "$idle"; r1=$(requests)
rate=$(python3 -c "print(round(($r1 - $r0) / $idle, 2))")
rss=0; for p in "${pids[@]}"; do rss=$((rss + $(awk '/VmRSS/ {print $2}' "/proc/$p/status"))); done
echo "{\"figure\":\"many_agents\",\"agents\":$agents,\"volumes_each\":$v,\"pvs\":$total,\"seconds_to_all_pvs\":$secs,\"idle_apiserver_requests_per_s\":$rate,\"mean_agent_rss_kib\":$((rss / agents))}"
printf '%-12s %7s %6s %10s %18s %14s\n' figure agents pvs seconds idle_api_req/s mean_rss_MiB
printf '%-12s %7s %6s %10s %18s %14s\n' many_agents "$agents" "$total" "$secs" "$rate" "$(python3 -c "print(round($rss/$agents/1024,1))")"
