#!/usr/bin/env bash
# Benchmark (not a test): mounts N tmpfs volumes one at a time (default 100) under a running,
# event-driven agent (minResyncPeriod 1h, so no resync helps) and reports the time from each
# mount to its PV being visible through an API watch: p50, p99, max. Then the agent's CPU
# seconds and resident memory over IDLE seconds (default 60) of idleness. Needs root.
n=${1:-100}
idle=${IDLE_SECONDS:-60}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
printf '1h\n' > "$work/config/minResyncPeriod"
start_agent
sleep 2
watch_pvs "$work/watch.log"
sleep 1
: > "$work/mounts.log"
for i in $(seq 1 "$n"); do
  mkdir -p "$work/disks/v$i"
  echo "$(date +%s.%N) v$i" >> "$work/mounts.log"
  mount -t tmpfs -o size=16m tmpfs "$work/disks/v$i"
  wait_pvs "$work/watch.log" "$i"
done
kill "$watch_pid" 2>/dev/null || true
read -r lat_json lat_table < <(latency "$work/mounts.log" "$work/watch.log" discovery_latency mounts)
idle_cost "$idle"
echo "$lat_json"
echo "{\"figure\":\"idle_cost\",\"volumes\":$n,\"seconds\":$idle,\"cpu_seconds\":$cpu,\"cpu_percent_of_core\":$pct,\"rss_kib\":$rss}"
IFS='|' read -r cnt p50 p99 max <<< "$lat_table"
printf '%-18s %8s %8s %8s %8s\n' figure mounts p50_s p99_s max_s
printf '%-18s %8s %8s %8s %8s\n' discovery_latency "$cnt" "$p50" "$p99" "$max"
printf '%-18s %8s %12s %12s %10s\n' figure volumes idle_s cpu_s rss_MiB
printf '%-18s %8s %12s %12s %10s\n' idle_cost "$n" "$idle" "$cpu" "$(python3 -c "print(round($rss/1024,1))")"
