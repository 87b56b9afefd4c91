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
k get pv --watch --no-headers -o custom-columns=NAME:.metadata.name 2>/dev/null | while read -r name; do
  echo "$(date +%s.%N) $name"
done > "$work/watch.log" &
watch_pid=$!
sleep 1
: > "$work/mounts.log"
for i in $(seq 1 "$n"); do
  mkdir -p "$work/disks/v$i"
  echo "$(date +%s.%N) v$i" >> "$work/mounts.log"
  mount -t tmpfs -o size=16m tmpfs "$work/disks/v$i"
  until [[ $(awk '{print $2}' "$work/watch.log" | sort -u | wc -l) -ge $i ]]; do sleep 0.01; done
done
kill "$watch_pid" 2>/dev/null || true
read -r lat_json lat_table < <(python3 - "$work/mounts.log" "$work/watch.log" <<'PY'
import sys
mounts = [float(l.split()[0]) for l in open(sys.argv[1])]
seen, firsts = set(), []
for l in open(sys.argv[2]):
    t, name = l.split()
    if name not in seen:
        seen.add(name); firsts.append(float(t))
lat = sorted(f - m for m, f in zip(mounts, firsts))
q = lambda p: lat[min(len(lat) - 1, int(round(p * (len(lat) - 1))))]
print(f'{{"figure":"discovery_latency","mounts":{len(lat)},"p50_s":{q(.5):.3f},"p99_s":{q(.99):.3f},"max_s":{lat[-1]:.3f}}}',
      f"{len(lat)}|{q(.5):.3f}|{q(.99):.3f}|{lat[-1]:.3f}")
PY
)
ticks() { awk '{print $14 + $15}' "/proc/$agent_pid/stat"; }
hz=$(getconf CLK_TCK)
t0=$(ticks); sleep "$idle"; t1=$(ticks)
cpu=$(python3 -c "print(round(($t1 - $t0) / $hz, 3))")
pct=$(python3 -c "print(round(100 * ($t1 - $t0) / $hz / $idle, 4))")
rss=$(awk '/VmRSS/ {print $2}' "/proc/$agent_pid/status")
echo "$lat_json"
echo "{\"figure\":\"idle_cost\",\"volumes\":$n,\"seconds\":$idle,\"cpu_seconds\":$cpu,\"cpu_percent_of_core\":$pct,\"rss_kib\":$rss}"
IFS='|' read -r cnt p50 p99 max <<< "$lat_table"
printf '%-18s %8s %8s %8s %8s\n' figure mounts p50_s p99_s max_s
printf '%-18s %8s %8s %8s %8s\n' discovery_latency "$cnt" "$p50" "$p99" "$max"
printf '%-18s %8s %12s %12s %10s\n' figure volumes idle_s cpu_s rss_MiB
printf '%-18s %8s %12s %12s %10s\n' idle_cost "$n" "$idle" "$cpu" "$(python3 -c "print(round($rss/1024,1))")"
