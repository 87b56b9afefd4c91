#!/usr/bin/env bash
# Benchmark (not a test): what one wedged disk costs the others. Mounts N tmpfs volumes
# (default 50) one at a time under a running, event-driven agent (minResyncPeriod 1h) and
# reports the time from each mount to its PV being visible through an API watch (p50, p99,
# max), twice, each run with its own agent and state directory:
#   healthy: nothing wedged;
#   frozen:  first an ext4 loop volume is mounted in the same discovery directory and frozen
#            with `fsfreeze -f` at once (before the agent can write its used mark), then the N
#            volumes are mounted. Afterwards it is thawed (`fsfreeze -u`) and the script reports
#            whether it was published and how long after the thaw.
# A volume not seen within WAIT_SECONDS (default 30: more than the default 10 s host-operation
# deadline) counts as not published in time; after STALL_LIMIT (default 2) such volumes in a
# row, the rest are mounted without waiting (an agent whose passes are blocked would make every
# wait run out) and counted once the volume is thawed. While the volume is frozen the agent's
# /readyz and its unresponsive/stuck metrics are printed (empty with a build before issue 27).
# Extra agent flags: AGENT_ARGS (e.g. "--host-op-timeout 2s"). Upstream is not run: lib.sh has
# no side-by-side mode. Needs root. Never fails on timing.
n=${1:-50}
wait_s=${WAIT_SECONDS:-30}
stall_limit=${STALL_LIMIT:-2}
thaw_wait_s=${THAW_WAIT_SECONDS:-120}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
printf '1h\n' > "$work/config/minResyncPeriod"

loop=""
frozen=$work/disks/frozen
# Thawed first: the agent may have a thread asleep on the frozen filesystem, and neither it nor
# umount finishes before the thaw.
wedged_cleanup() {
  if mountpoint -q "$frozen"; then fsfreeze -u "$frozen" 2> /dev/null || true; fi
  bench_cleanup
  if [[ -n "$loop" ]]; then losetup -d "$loop" 2> /dev/null || true; fi
}
trap wedged_cleanup EXIT

# start_run LABEL: an agent of its own (own state directory) as the ServiceAccount; its PID in
# $agent_pid (stopped by lib.sh's trap if the script ends early).
start_run() {
  # shellcheck disable=SC2086
  RUST_LOG=${RUST_LOG:-warn} "$bin" run ${AGENT_ARGS:-} --listen-address 127.0.0.1:0 --config-dir "$work/config" \
    --node-name bench-node --kubeconfig "$work/agent.kubeconfig" --state-dir "$work/state-$1" \
    2> "$work/agent-$1.log" &
  agent_pid=$!
}
# stop_agent: by its PID, then wait for it.
stop_agent() {
  kill "$agent_pid" 2> /dev/null || true
  wait "$agent_pid" 2> /dev/null || true
  agent_pid=""
}
# The agent's admin address (it listens on a free port).
admin_addr() {
  ss -ltnpH 2> /dev/null | awk -v pid="pid=$agent_pid," 'index($0, pid) {print $4; exit}'
}
# watch_paths FILE: "<time> <PV name> <path>" for every PV event, in the background ($watch_pid).
watch_paths() {
  k get pv --watch --no-headers -o custom-columns=NAME:.metadata.name,PATH:.spec.local.path 2> /dev/null \
    | while read -r name path; do echo "$(date +%s.%N) $name $path"; done > "$1" &
  watch_pid=$!
}
# seen FILE PATH: whether a PV of PATH has been seen; wait_path FILE PATH SECONDS: until it is,
# or SECONDS have passed (then fails).
seen() { awk -v p="$2" '$3 == p {found = 1} END {exit !found}' "$1"; }
wait_path() {
  local until=$((${EPOCHREALTIME/./} + $3 * 1000000))
  until seen "$1" "$2"; do
    ((${EPOCHREALTIME/./} < until)) || return 1
    sleep 0.01
  done
}
# summary LABEL MOUNTS WATCH: latencies of the PVs seen; prints the JSON line, a space and
# "n|published|p50|p99|max" for the table (null when none was seen).
summary() {
  python3 - "$@" <<'PY'
import json, sys
label, mounts, watch = sys.argv[1:4]
first = {}
for l in open(watch):
    t, _, path = l.split()
    first.setdefault(path, float(t))
starts = [(float(t), p) for t, p in (l.split() for l in open(mounts))]
lat = sorted(first[p] - t for t, p in starts if p in first)
q = lambda p: round(lat[min(len(lat) - 1, int(round(p * (len(lat) - 1))))], 3) if lat else None
fig = {"figure": "wedged_volume", "run": label, "mounts": len(starts), "published": len(lat),
       "p50_s": q(.5), "p99_s": q(.99), "max_s": round(lat[-1], 3) if lat else None}
cell = lambda v: "-" if v is None else str(v)
print(json.dumps(fig, separators=(",", ":")),
      "|".join(cell(v) for v in (len(starts), len(lat), fig["p50_s"], fig["p99_s"], fig["max_s"])))
PY
}

# run LABEL [freeze]: one run; sets ${label}_json and ${label}_table, and for a frozen run
# thaw_json.
run() {
  local label=$1 freeze=${2:-} i path stalls=0 waiting=1 t_freeze t_thaw addr
  start_run "$label"
  sleep 2
  watch_paths "$work/watch-$label.log"
  sleep 1
  if [[ -n "$freeze" ]]; then
    truncate -s 256M "$work/frozen.img"
    mkfs.ext4 -q -F "$work/frozen.img"
    loop=$(losetup --find --show "$work/frozen.img")
    mkdir -p "$frozen"
    mount "$loop" "$frozen"
    fsfreeze -f "$frozen"
    t_freeze=$(now)
    # The steady state "one volume wedged": the agent reports the frozen volume unresponsive
    # (its used-mark write passed its deadline, --host-op-timeout) before the healthy volumes
    # are mounted. How long that took is printed; an agent before issue 27 never gets there
    # (30 s cap).
    addr=$(admin_addr)
    local met_deadline=$((SECONDS + 30))
    until curl -s --max-time 2 "http://$addr/metrics" | grep -q "^local_static_provisioner_volume_unresponsive{path=\"[^\"]*frozen\""; do
      ((SECONDS < met_deadline)) || break
      sleep 0.1
    done
    echo "{\"figure\":\"wedged_volume_reported_unresponsive\",\"seconds\":$(elapsed "$t_freeze" "$(now)")}"
  fi
  : > "$work/mounts-$label.log"
  for i in $(seq 1 "$n"); do
    path=$work/disks/$label-$i
    mkdir -p "$path"
    echo "$(now) $path" >> "$work/mounts-$label.log"
    mount -t tmpfs -o size=16m tmpfs "$path"
    if ((waiting)); then
      if wait_path "$work/watch-$label.log" "$path" "$wait_s"; then
        stalls=0
      else
        stalls=$((stalls + 1))
        ((stalls < stall_limit)) || waiting=0
      fi
    else
      sleep 0.05
    fi
  done
  # The last volume mounted without waiting gets its chance too.
  ((waiting)) || wait_path "$work/watch-$label.log" "$path" 2 || true
  read -r "${label}_json" "${label}_table" < <(summary "$label" "$work/mounts-$label.log" "$work/watch-$label.log")
  if [[ -n "$freeze" ]]; then
    addr=$(admin_addr)
    if [[ -n "$addr" ]]; then
      echo "while frozen, /readyz: $(curl -s --max-time 5 "http://$addr/readyz" || true)"
      curl -s --max-time 5 "http://$addr/metrics" | grep -E '^local_static_provisioner_(volume_unresponsive|host_operations_stuck|volume_failing)' || true
    fi
    local before=false
    seen "$work/watch-$label.log" "$frozen" && before=true
    t_thaw=$(now)
    fsfreeze -u "$frozen"
    wait_path "$work/watch-$label.log" "$frozen" "$thaw_wait_s" || true
    # The healthy volumes not seen before the thaw (an agent whose passes were blocked).
    for i in $(seq 1 "$n"); do wait_path "$work/watch-$label.log" "$work/disks/$label-$i" 10 || break; done
    thaw_json=$(python3 - "$work/watch-$label.log" "$work/mounts-$label.log" "$frozen" "$t_thaw" "$before" "$t_freeze" <<'PY'
import json, sys
watch, mounts, frozen, thaw, before = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
freeze = float(sys.argv[6])
first = {}
for l in open(watch):
    t, _, path = l.split()
    first.setdefault(path, float(t))
healthy = [first.get(p) for _, p in (l.split() for l in open(mounts))]
late = [t - thaw for t in healthy if t is not None and t >= thaw]
fig = {"figure": "wedged_volume_thaw", "frozen_for_s": round(thaw - freeze, 1),
       "frozen_published_before_thaw": before == "true",
       "frozen_published_after_thaw_s": round(max(0, first[frozen] - thaw), 3) if frozen in first else None,
       "healthy_published_before_thaw": sum(1 for t in healthy if t is not None and t < thaw),
       "healthy_published_after_thaw": len(late),
       "last_healthy_after_thaw_s": round(max(late), 3) if late else None,
       "healthy_never_published": sum(1 for t in healthy if t is None)}
print(json.dumps(fig, separators=(",", ":")))
PY
)
  fi
  kill "$watch_pid" 2> /dev/null || true
  # The healthy volumes go, so the next run starts with no PV: the agent withdraws them.
  for i in $(seq 1 "$n"); do umount "$work/disks/$label-$i"; done
  if [[ -n "$freeze" ]]; then umount "$frozen"; fi
  local deadline=$((SECONDS + 60))
  while [[ -n $(k get pv --no-headers 2> /dev/null) ]] && ((SECONDS < deadline)); do sleep 0.2; done
  stop_agent
}

run healthy
run frozen freeze
losetup -d "$loop" && loop=""
echo "$healthy_json"
echo "$frozen_json"
echo "$thaw_json"
printf '%-14s %8s %10s %8s %8s %8s\n' run mounts published p50_s p99_s max_s
for r in healthy frozen; do
  t=${r}_table
  IFS='|' read -r cnt pub p50 p99 max <<< "${!t}"
  printf '%-14s %8s %10s %8s %8s %8s\n' "$r" "$cnt" "$pub" "$p50" "$p99" "$max"
done
python3 - "$thaw_json" <<'PY'
import json, sys
t = json.loads(sys.argv[1])
after = t["frozen_published_after_thaw_s"]
print("frozen volume (frozen for %s s): published before the thaw: %s; after the thaw: %s" % (
    t["frozen_for_s"], "yes" if t["frozen_published_before_thaw"] else "no", "not within the wait" if after is None else "%s s" % after))
print("healthy volumes: %d published before the thaw, %d after it (the last %s s after it), %d never" % (
    t["healthy_published_before_thaw"], t["healthy_published_after_thaw"], t["last_healthy_after_thaw_s"],
    t["healthy_never_published"]))
PY
