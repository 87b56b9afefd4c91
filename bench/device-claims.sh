#!/usr/bin/env bash
# Benchmark (not a test): raw devices claimed by a class's `devices` section. Attaches N blank
# loop devices (default 20) one at a time, 2 s apart, under a running agent (minResyncPeriod 1h,
# so only the block-device watch finds them) and reports the time from each attach to
# its PV being visible through an API watch: p50, p99, max. Then one `disks` run over the
# node (every device probed as the agent does) and the agent's CPU seconds and resident memory
# over IDLE seconds (default 30) with the devices claimed. Needs root.
n=${1:-20}
idle=${IDLE_SECONDS:-30}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# A size no other device here has, so only this benchmark's loop devices are selected.
mib=61
printf '1h\n' > "$work/config/minResyncPeriod"
printf 'fast-disks:\n  hostDir: %s\n  mountDir: %s\n  volumeMode: Block\n  devices:\n    types: [loop]\n    minSize: %sMi\n    maxSize: %sMi\n' \
  "$work/disks" "$work/disks" "$mib" "$mib" > "$work/config/storageClassMap"
loops=()
detach_loops() {
  for l in "${loops[@]}"; do losetup -d "$l" 2> /dev/null || true; done
}
trap 'detach_loops; bench_cleanup' EXIT
start_agent
sleep 2
watch_pvs "$work/watch.log"
sleep 1
mkdir -p "$work/images"
: > "$work/attach.log"
for i in $(seq 1 "$n"); do
  # Quiet first: the passes the previous PV's events cause must not find this device early,
  # so what is measured is the block-device watch alone.
  sleep 2
  truncate -s "${mib}M" "$work/images/d$i.img"
  echo "$(date +%s.%N) d$i" >> "$work/attach.log"
  loops+=("$(losetup --find --show "$work/images/d$i.img")")
  wait_pvs "$work/watch.log" "$i"
done
kill "$watch_pid" 2>/dev/null || true
read -r lat_json lat_table < <(latency "$work/attach.log" "$work/watch.log" claim_latency devices)
listed=$(ls /sys/class/block | wc -l)
t0=$(now)
"$bin" disks --config-dir "$work/config" --state-dir "$work/state" --output json > "$work/disks.json"
disks_s=$(elapsed "$t0" "$(now)")
claimed=$(python3 -c "import json,sys; print(sum(1 for d in json.load(open(sys.argv[1])) if any(v.startswith('claimed') for v in d['classes'].values())))" "$work/disks.json")
idle_cost "$idle"
echo "$lat_json"
echo "{\"figure\":\"disks_command\",\"block_devices\":$listed,\"claimed\":$claimed,\"seconds\":$disks_s}"
echo "{\"figure\":\"idle_with_claims\",\"devices\":$n,\"seconds\":$idle,\"cpu_seconds\":$cpu,\"cpu_percent_of_core\":$pct,\"rss_kib\":$rss}"
IFS='|' read -r cnt p50 p99 max <<< "$lat_table"
printf '%-18s %8s %8s %8s %8s\n' figure devices p50_s p99_s max_s
printf '%-18s %8s %8s %8s %8s\n' claim_latency "$cnt" "$p50" "$p99" "$max"
printf '%-18s %14s %8s %8s\n' figure block_devices claimed seconds
printf '%-18s %14s %8s %8s\n' disks_command "$listed" "$claimed" "$disks_s"
printf '%-18s %8s %12s %12s %10s\n' figure devices idle_s cpu_s rss_MiB
printf '%-18s %8s %12s %12s %10s\n' idle_with_claims "$n" "$idle" "$cpu" "$(python3 -c "print(round($rss/1024,1))")"
