#!/usr/bin/env bash
# Benchmark (not a test): what proving a raw device blank costs (docs/devices.md, "What is
# proven"). On blank sparse loop devices (the image's holes read from memory: an upper bound of
# the rate; a real disk is bound by its random read rate):
# - probe: one `disks` run over a class that selects exactly one device of 100 GiB, then of
#   1 TiB (inventory, exclusive probe, signature areas and the sampled windows), median of 3;
# - claim latency: N (default 3) blank 100 GiB devices attached one at a time under a running
#   agent, from the attach to the PV seen through an API watch (the target: under 2 s);
# - full read: `verify: full` over one blank device of FULL_GIB GiB (default 4): the agent's own
#   log line at the end of the read (seconds, MiB/s).
# Needs root and about nothing on disk (sparse images). Prints JSON lines, then a table.
n=${1:-3}
full_gib=${FULL_GIB:-4}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
loops=()
detach_loops() {
  for l in "${loops[@]}"; do losetup -d "$l" 2> /dev/null || true; done
}
trap 'detach_loops; bench_cleanup' EXIT
mkdir -p "$work/images" "$work/state"
printf '1h\n' > "$work/config/minResyncPeriod"
# class_for MIB [extra devices keys]: the class selects loop devices of exactly MIB MiB.
class_for() {
  printf 'fast-disks:\n  hostDir: %s\n  mountDir: %s\n  volumeMode: Block\n  devices:\n    types: [loop]\n    minSize: %sMi\n    maxSize: %sMi\n%s' \
    "$work/disks" "$work/disks" "$1" "$1" "${2:-}" > "$work/config/storageClassMap"
}
attach() {
  truncate -s "$2" "$work/images/$1.img"
  loops+=("$(losetup --find --show "$work/images/$1.img")")
}

# Probe time: sizes no other device here has (100 GiB + 1 MiB, 1 TiB + 1 MiB).
probe_json=() probe_rows=()
for spec in "100G:102401" "1T:1048577"; do
  label=${spec%%:*} mib=${spec##*:}
  attach "probe-$label" "${mib}M"
  class_for "$mib"
  runs=()
  for _ in 1 2 3; do
    t0=$(now)
    "$bin" disks --config-dir "$work/config" --state-dir "$work/state" --output json > "$work/disks.json"
    runs+=("$(elapsed "$t0" "$(now)")")
  done
  dev=$(basename "${loops[-1]}")
  verdict=$(python3 -c "import json,sys; d=[x for x in json.load(open(sys.argv[1])) if x['name'] == sys.argv[2]]; print(list(d[0]['classes'].values())[0].split(' ->')[0] if d and d[0]['classes'] else 'none')" "$work/disks.json" "$dev")
  median=$(printf '%s\n' "${runs[@]}" | sort -n | sed -n 2p)
  probe_json+=("{\"figure\":\"probe\",\"size\":\"$label\",\"runs\":[$(IFS=,; echo "${runs[*]}")],\"median_s\":$median,\"verdict\":\"$verdict\"}")
  probe_rows+=("$(printf '%-14s %8s %10s  %s' probe "$label" "$median" "$verdict")")
done

# Claim latency of blank 100 GiB devices (the block-device watch finds them; resync 1 h).
mib=102400
class_for "$mib"
RUST_LOG=${RUST_LOG:-info} start_agent 2> "$work/agent.log"
sleep 2
watch_pvs "$work/watch.log"
sleep 1
: > "$work/attach.log"
for i in $(seq 1 "$n"); do
  sleep 2
  truncate -s "${mib}M" "$work/images/c$i.img"
  echo "$(date +%s.%N) c$i" >> "$work/attach.log"
  loops+=("$(losetup --find --show "$work/images/c$i.img")")
  wait_pvs "$work/watch.log" "$i"
done
kill "$watch_pid" 2>/dev/null || true
read -r lat_json lat_table < <(latency "$work/attach.log" "$work/watch.log" claim_latency_100g devices)

# Full read: a class with verify: full over one blank device; the agent reloads the config.
full_mib=$(( full_gib * 1024 + 3 ))
class_for "$full_mib" "    verify: full
"
attach full "${full_mib}M"
deadline=$(( SECONDS + 600 ))
until grep -q 'full read: blank' "$work/agent.log" || (( SECONDS > deadline )); do sleep 0.5; done
line=$(grep 'full read: blank' "$work/agent.log" | tail -1)
seconds=$(sed -n 's/.*seconds="\{0,1\}\([0-9.]*\).*/\1/p' <<< "$line")
rate=$(sed -n 's/.*rate_mib_s="\{0,1\}\([0-9.]*\).*/\1/p' <<< "$line")

for j in "${probe_json[@]}"; do echo "$j"; done
echo "$lat_json"
echo "{\"figure\":\"full_read\",\"gib\":$full_gib,\"seconds\":${seconds:-null},\"mib_per_s\":${rate:-null}}"
printf '%-14s %8s %10s  %s\n' figure size median_s verdict
for r in "${probe_rows[@]}"; do echo "$r"; done
IFS='|' read -r cnt p50 p99 max <<< "$lat_table"
printf '%-20s %8s %8s %8s %8s\n' figure devices p50_s p99_s max_s
printf '%-20s %8s %8s %8s %8s\n' claim_latency_100g "$cnt" "$p50" "$p99" "$max"
printf '%-14s %8s %10s %10s\n' figure GiB seconds MiB/s
printf '%-14s %8s %10s %10s\n' full_read "$full_gib" "${seconds:--}" "${rate:--}"
