#!/usr/bin/env bash
# Benchmark (not a test): a fleet of A agents (default 50) against one control plane, each its
# own Node object, its own hostDir with V tmpfs volumes (default 10) configured for it alone,
# and its own state dir; ours and upstream's v2.9.0 side by side, each on a fresh control plane
# (IMPL=ours|upstream|both, default both). Each agent runs in a mount namespace of its own
# (unshare -m, private propagation) where its V volumes are mounted, as on A real nodes: its
# mount table holds the host's mounts as they were at its start and its own volumes, and no
# other agent's mount, nor any later mount of the host, reaches it. (With one shared table every
# agent read all A*V mounts on each pass, and each mount anywhere on the host woke every agent.)
# Phases, the same for both:
#   publish  all A agents started at once: seconds until all A*V PVs exist; creates sent (from
#            the audit log) vs PVs, and Warning events saying a volume is "already published"
#            (false refusals: every volume here is its own disk); the agents' requests and the
#            API server's CPU-s from the start until every PV is Available and 11 s more;
#   idle     once every PV is Available, 11 s of quiet (see idle_cost in lib.sh), then
#            IDLE_SECONDS (default 60): CPU-s of all agents together (/proc/PID/stat), of the
#            API server, the agents' requests (audit log, by verb+resource), PV watch events
#            the API server sent (to every watcher: the agents, the PV controller, this script;
#            bookmarks included), and the host's mount table changes in the window (each
#            wakes every agent of ours for a pass: other work on the same host counts);
#   churn    CHURN volumes (default 100, at most half the PVs; 0 skips it), round-robin over
#            the agents: (a) released: a PVC pre-bound to each PV, then deleted (reclaim
#            Delete): until every PV is Available again under a new UID; (b) deleted:
#            `kubectl delete pv` of other Available PVs: until each is back, Available. Requests
#            per PV by verb+resource over the window (ending 12 s after the last PV is back,
#            one upstream discovery period), raw and net of the idle rate; API server CPU-s per PV.
# The agents' requests are those of the agent ServiceAccount, which start.sh's audit policy
# logs. Upstream runs as that same ServiceAccount with upstream's own ClusterRole bound to it
# besides ours (its Helm chart's rules: it GETs StorageClasses and writes core/v1 Events, which
# ours does not grant), with its config bind-mounted in its namespace at the fixed
# /etc/provisioner/config (an empty directory made on the host for that if missing, removed
# again at the end).
# NOISE=1: during the idle window a tmpfs outside every discovery directory is mounted and
# unmounted twice a second in each agent's mount namespace (a busy node: kubelet mounts and
# unmounts for every pod); bench/busy-node.sh sets it.
# Prints JSON lines and tables; never fails on timing (a phase that times out reports what it
# saw). Needs root. Usage: fleet.sh [A] [V]; BENCH_BIN as in lib.sh; FIGURE names the figures
# (default fleet).
agents=${1:-50}
v=${2:-10}
impl=${IMPL:-both}
idle=${IDLE_SECONDS:-60}
churn=${CHURN:-100}
figure=${FIGURE:-fleet}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [[ $impl == both ]]; then
  set -uo pipefail
  [[ $(id -u) == 0 ]] || { echo "benchmark: needs root (mounts)" >&2; exit 1; }
  tmp=$(mktemp -d -t lsp-fleet.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
  # One build of each for both runs.
  if [[ -z "${BENCH_BIN:-}" ]]; then
    (cd "$here/.." && cargo build --release --locked -q) || exit 1
    cp "${CARGO_TARGET_DIR:-$here/../target}/release/local-static-provisioner" "$tmp/ours"
    export BENCH_BIN=$tmp/ours
  fi
  bash "$here/upstream/build.sh" > /dev/null || exit 1
  for i in ours upstream; do
    IMPL=$i bash "$0" "$agents" "$v" | tee -a "$tmp/lines"
  done
  python3 - "$tmp/lines" <<'PY'
import json, sys
rows = {}
for l in open(sys.argv[1]):
    if l.startswith("{"):
        j = json.loads(l)
        rows.setdefault(j["impl"], {})[j["figure"].rsplit("_", 1)[-1]] = j
cols = [("publish s", "publish", "seconds_to_all_pvs"), ("creates", "publish", "creates_sent"),
        ("publish requests", "publish", "requests_until_settled"),
        ("publish apiserver CPU-s", "publish", "apiserver_cpu_s_until_settled"),
        ("refused", "publish", "already_published_warnings"), ("idle agents CPU-s/min", "idle", "agents_cpu_s_per_min"),
        ("idle apiserver CPU-s", "idle", "apiserver_cpu_s"), ("idle req/min", "idle", "agent_requests_per_min"),
        ("mean RSS MiB", "idle", "mean_agent_rss_mib"), ("req/released PV", "released", "requests_per_pv"),
        ("req/deleted PV", "deleted", "requests_per_pv")]
print("side by side:")
print("%-24s" % "" + "".join("%12s" % i for i in rows))
for name, fig, key in cols:
    print("%-24s" % name + "".join("%12s" % rows[i].get(fig, {}).get(key, "-") for i in rows))
PY
  exit 0
fi
[[ $impl == ours || $impl == upstream ]] || { echo "IMPL must be ours, upstream or both" >&2; exit 2; }
if [[ $impl == upstream ]]; then
  up_bin=$(bash "$here/upstream/build.sh")/local-volume-provisioner || exit 1
  # lib.sh copies our binary (or builds it): not run here, so any file will do.
  export BENCH_BIN=${BENCH_BIN:-$(command -v true)}
fi
source "$here/lib.sh"
kubectl=$CONTROL_PLANE_BIN/kubectl
user=system:serviceaccount:local-static-provisioner:local-static-provisioner
total=$((agents * v))
(( churn > total / 2 )) && churn=$((total / 2))
# The interpreter itself, not a version manager's shim: the phases poll through it.
python=$(python3 -c 'import sys; print(sys.executable)')
python3() { "$python" "$@"; }
py() { "$python" "$here/fleet.py" "$@"; }
jget() { "$python" -c "import json,sys; d=json.loads(sys.argv[1]); print(d$2)" "$1"; }

pids=()
noise_pids=()
watch_pid=""
made_etc=""
fleet_cleanup() {
  set +e
  # The watch loop, then its kubectl (a child of that loop).
  if [[ -n "$watch_pid" ]]; then
    kill -STOP "$watch_pid"; pkill -P "$watch_pid"; kill "$watch_pid"; kill -CONT "$watch_pid"
  fi
  for p in "${noise_pids[@]}" "${pids[@]}"; do kill "$p" 2> /dev/null; done
  for p in "${noise_pids[@]}" "${pids[@]}" $watch_pid; do wait "$p" 2> /dev/null; done
  # Every mount under $work, deepest first (volumes), before lib.sh's cleanup removes $work.
  awk -v w="$work/" 'index($5, w) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    umount "$m"
  done
  [[ -n "$made_etc" ]] && rmdir /etc/provisioner/config /etc/provisioner 2> /dev/null
  bench_cleanup
}
trap fleet_cleanup EXIT
trap 'exit 143' TERM INT

# ---- nodes, volumes, configs ----
for a in $(seq 1 "$agents"); do
  printf -- '---\napiVersion: v1\nkind: Node\nmetadata: {name: node-%s, labels: {kubernetes.io/hostname: node-%s}}\n' "$a" "$a"
done | k apply -f - > /dev/null
for a in $(seq 1 "$agents"); do
  mkdir -p "$work/agent-$a/config" "$work/agent-$a/state" "$work/vols/node-$a"
  for i in $(seq 1 "$v"); do mkdir -p "$work/vols/node-$a/v$i"; done
  printf 'fast-disks:\n  hostDir: %s\n  mountDir: %s\n' "$work/vols/node-$a" "$work/vols/node-$a" \
    > "$work/agent-$a/config/storageClassMap"
done
if [[ $impl == upstream ]]; then
  upstream_node_rbac
  # The mount point upstream's config is bound onto in each agent's namespace; an empty
  # directory on the host, removed again at the end if this script made it.
  if [[ ! -d /etc/provisioner/config ]]; then
    mkdir -p /etc/provisioner/config
    made_etc=1
  fi
fi

# ---- a watch of every PV: "<time> EVENT NAME UID PHASE NODE" ----
# kubectl ends its watch on an error (the API server sheds load while 50 agents start), so
# it is started again at once: its first answer lists every PV again, as ADDED.
: > "$work/watch.log"
pv_watch() {
  while :; do
    "$kubectl" get pv --watch --output-watch-events --no-headers -o \
      'custom-columns=EVENT:.type,NAME:.object.metadata.name,UID:.object.metadata.uid,PHASE:.object.status.phase,NODE:.object.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]' \
      2>> "$work/watch.err"
    echo "watch ended ($?), started again" >> "$work/watch.err"
    sleep 0.2
  done
}
pv_watch > >(while read -r line; do echo "$EPOCHREALTIME $line"; done >> "$work/watch.log") &
watch_pid=$!
sleep 1
count_pvs() { py pvs "$work/watch.log" | python3 -c "import json,sys; print(len(json.load(sys.stdin)))"; }
count_phase() { py pvs "$work/watch.log" | python3 -c "import json,sys; print(sum(1 for v in json.load(sys.stdin).values() if v[1] == sys.argv[1]))" "$1"; }
cpu_each() { # utime+stime of each of the given PIDs, comma-separated
  local p out=""
  for p in "$@"; do out+="$(awk '{print $14 + $15}' "/proc/$p/stat" 2> /dev/null || echo 0),"; done
  echo "${out%,}"
}
cpu_ticks() { # sum of utime+stime of the given PIDs
  local p s=0
  for p in "$@"; do s=$((s + $(awk '{print $14 + $15}' "/proc/$p/stat" 2> /dev/null || echo 0))); done
  echo "$s"
}
hz=$(getconf CLK_TCK)
api_pid=$(awk '$2 == "kube-apiserver" {print $1}' "$work/cp/pids")
watch_events() {
  k get --raw /metrics | awk '/^apiserver_watch_events_total\{/ && /persistentvolumes/ {s += $NF} END {printf "%d", s}'
}
# until_or SECONDS COMMAND...: runs COMMAND every half second until it succeeds or SECONDS pass.
until_or() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do (( SECONDS < deadline )) || return 1; sleep 0.5; done
}

# ---- publish ----
# on_node A CMD...: runs CMD (exec'd, so its PID is the one recorded) in a new private mount
# namespace, after mounting agent A's V tmpfs volumes there and, for upstream, binding its
# config at /etc/provisioner/config.
node_sh='d=$1; n=$2; cfg=$3; shift 3
i=1; while [ "$i" -le "$n" ]; do mount -t tmpfs -o size=16m tmpfs "$d/v$i" || exit 1; i=$((i + 1)); done
[ -z "$cfg" ] || mount --bind "$cfg" /etc/provisioner/config || exit 1
exec "$@"'
# Called in a background subshell: `exec`, so the PID recorded ($!) becomes the agent's own.
on_node() {
  local a=$1 cfg=$2; shift 2
  exec unshare -m --propagation private sh -c "$node_sh" sh "$work/vols/node-$a" "$v" "$cfg" "$@"
}
start=$(now); p0=$(cpu_ticks "$api_pid")
for a in $(seq 1 "$agents"); do
  if [[ $impl == ours ]]; then
    RUST_LOG=warn on_node "$a" "" "$bin" run --listen-address 127.0.0.1:0 --config-dir "$work/agent-$a/config" \
      --node-name "node-$a" --kubeconfig "$work/agent.kubeconfig" --state-dir "$work/agent-$a/state" \
      2> "$work/agent-$a.log" &
  else
    MY_NODE_NAME=node-$a MY_NAMESPACE=local-static-provisioner KUBECONFIG=$work/agent.kubeconfig \
      on_node "$a" "$work/agent-$a/config" "$up_bin" --listen-address=127.0.0.1:0 2> "$work/agent-$a.log" &
  fi
  pids+=($!)
done
all_published() { [[ $(count_pvs) -ge $total ]]; }
until_or 900 all_published || echo "fleet: not all $total PVs after 900 s" >&2
pub=$(py published "$work/watch.log" "$total")
seen=$(jget "$pub" '["count"]')
t_pub=$(jget "$pub" '["time"]')
secs=null; [[ $t_pub != None ]] && secs=$(elapsed "$start" "$t_pub")
# Settled: every PV Available (the PV controller is throttled to 20 requests/s).
all_available() { [[ $(count_phase Available) -ge $total ]]; }
until_or 600 all_available || echo "fleet: not all PVs Available after 600 s" >&2
sleep 11
t_settled=$(now); p1=$(cpu_ticks "$api_pid")
pub_cpu=$("$python" -c "print(round(($p1 - $p0) / $hz, 2))")
pubreq=$(py requests "$work/cp/logs/audit.log" "$user" "$start" "$t_settled")
creates=$(jget "$pubreq" '["by"].get("create persistentvolumes", 0)')
conflicts=$(jget "$pubreq" '["conflicts"]')
k get events -A -o json > "$work/events.json"
refusals=$(py refusals "$work/events.json")
echo "{\"figure\":\"${figure}_publish\",\"impl\":\"$impl\",\"agents\":$agents,\"volumes_each\":$v,\"pvs\":$total,\"pvs_seen\":$seen,\"seconds_to_all_pvs\":$secs,\"creates_sent\":$creates,\"conflicts_409\":$conflicts,\"already_published_warnings\":$(jget "$refusals" '["already_published_warnings"]'),\"volumes_refused\":$(jget "$refusals" '["volumes_refused"]'),\"requests_until_settled\":$(jget "$pubreq" '["total"]'),\"apiserver_cpu_s_until_settled\":$pub_cpu,\"requests_by\":$(jget "$pubreq" '["by"]' | tr "'" '"'),\"failed_answers\":$(jget "$pubreq" '["failed"]' | tr "'" '"')}"

# ---- idle ----
w0=$(watch_events)
py mount-events "$idle" > "$work/mount-events.json" &
mount_events_pid=$!
if [[ ${NOISE:-0} == 1 ]]; then
  for i in "${!pids[@]}"; do
    mkdir -p "$work/noise-$i"
    nsenter -t "${pids[$i]}" -m sh -c 'while :; do mount -t tmpfs noise "$1"; umount "$1"; sleep 0.5; done' sh "$work/noise-$i" &
    noise_pids+=($!)
  done
fi
t0=$(now); a0=$(cpu_each "${pids[@]}"); s0=$(cpu_ticks "$api_pid")
sleep "$idle"
for p in "${noise_pids[@]}"; do kill "$p" 2> /dev/null; wait "$p" 2> /dev/null || true; done
noise_pids=()
wait "$mount_events_pid" || echo '{"mount_events":null}' > "$work/mount-events.json"
t1=$(now); a1=$(cpu_each "${pids[@]}"); s1=$(cpu_ticks "$api_pid")
w1=$(watch_events)
idlereq=$(py requests "$work/cp/logs/audit.log" "$user" "$t0" "$t1")
rss=0; for p in "${pids[@]}"; do rss=$((rss + $(awk '/VmRSS/ {print $2}' "/proc/$p/status" 2> /dev/null || echo 0))); done
alive=0; for p in "${pids[@]}"; do kill -0 "$p" 2> /dev/null && alive=$((alive + 1)); done
python3 - "$figure" "$impl" "$agents" "$total" "$idle" "$hz" "$a0" "$a1" "$s0" "$s1" "$w0" "$w1" "$rss" "$alive" "$idlereq" "$t0" "$t1" "$(cat "$work/mount-events.json")" <<'PY' > "$work/idle.json"
import json, sys
fig, impl, agents, total, idle, hz, a0, a1, s0, s1, w0, w1, rss, alive = sys.argv[1:15]
req = json.loads(sys.argv[15]); dur = float(sys.argv[17]) - float(sys.argv[16])
agents, idle, hz = int(agents), float(idle), float(hz)
each = sorted((b - a) / hz for a, b in zip(map(int, a0.split(",")), map(int, a1.split(","))))
cpu = sum(each)
print(json.dumps({"figure": fig + "_idle", "impl": impl, "agents": agents, "pvs": int(total), "seconds": idle,
    "agents_cpu_s": round(cpu, 3), "agents_cpu_s_per_min": round(cpu * 60 / idle, 3),
    "agent_cpu_s_median": round(each[len(each) // 2], 3), "agent_cpu_s_max": round(each[-1], 3),
    "apiserver_cpu_s": round((int(s1) - int(s0)) / hz, 3), "agent_requests": req["total"],
    "agent_requests_per_min": round(req["total"] * 60 / dur, 2), "requests_by": req["by"],
    # Node inventory (issue 31): status writes of an idle fleet; the goal is none.
    "inventory_writes_per_min": round(req["by"].get("patch localstoragenodes/status", 0) * 60 / dur, 2),
    "pv_watch_events_all_watchers": int(w1) - int(w0), "agents_alive": int(alive),
    "host_mount_events": json.loads(sys.argv[18])["mount_events"],
    "total_agent_rss_kib": int(rss), "mean_agent_rss_mib": round(int(rss) / agents / 1024, 1)}, separators=(",", ":")))
PY
cat "$work/idle.json"
idle_rate=$(jget "$(cat "$work/idle.json")" '["agent_requests"]')

# ---- churn ----
# churn_phase KIND NAMES_JSON ACTION...: t0, ACTION, until every PV of NAMES is Available
# under a new UID, 12 s more; prints the phase's JSON line.
churn_phase() {
  local kind=$1 names=$2; shift 2
  local t0 t1 s0 s1 r last secs
  t0=$(now); s0=$(cpu_ticks "$api_pid")
  "$@" > /dev/null
  all_renewed() { [[ $(jget "$(py renewed "$work/watch.log" "$names")" '["done"]') -ge $churn ]]; }
  until_or 900 all_renewed || echo "fleet: $kind churn not done after 900 s" >&2
  r=$(py renewed "$work/watch.log" "$names")
  last=$(jget "$r" '["time"]')
  secs=null; [[ $last != None ]] && secs=$(elapsed "$t0" "$last")
  sleep 12
  t1=$(now); s1=$(cpu_ticks "$api_pid")
  python3 - "$figure" "$impl" "$kind" "$churn" "$r" "$secs" "$t0" "$t1" "$s0" "$s1" "$hz" \
    "$(py requests "$work/cp/logs/audit.log" "$user" "$t0" "$t1")" "$(cat "$work/idle.json")" <<'PY'
import json, sys
fig, impl, kind, k, r, secs, t0, t1, s0, s1, hz, req, idle = sys.argv[1:14]
k, r, req, idle = int(k), json.loads(r), json.loads(req), json.loads(idle)
dur = float(t1) - float(t0)
scale = dur / idle["seconds"]
net = {key: round((n - idle["requests_by"].get(key, 0) * scale) / k, 2) for key, n in req["by"].items()}
print(json.dumps({"figure": f"{fig}_churn_{kind}", "impl": impl, "pvs": k, "renewed": r["done"],
    "seconds_until_all_back": None if secs == "null" else float(secs), "window_s": round(dur, 1),
    "requests": req["total"], "requests_per_pv": round(req["total"] / k, 2),
    "requests_per_pv_net_of_idle": round((req["total"] - idle["agent_requests"] * scale) / k, 2),
    "per_pv_by": {key: round(n / k, 2) for key, n in req["by"].items()},
    "per_pv_net_by": net, "conflicts_409": req["conflicts"], "failed_answers": req["failed"],
    "apiserver_cpu_s": round((int(s1) - int(s0)) / float(hz), 3),
    "apiserver_cpu_s_per_pv": round((int(s1) - int(s0)) / float(hz) / k, 4)}, separators=(",", ":")))
PY
}
if (( churn > 0 )); then
  released=$(py pick "$work/watch.log" "$churn" 0)
  python3 - "$released" <<'PY' > "$work/pvcs.yaml"
import json, sys
for i, name in enumerate(json.loads(sys.argv[1])):
    print(f"""---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: churn-{i}, namespace: default, labels: {{bench: churn}}}}
spec: {{accessModes: [ReadWriteOnce], storageClassName: fast-disks, volumeName: {name}, resources: {{requests: {{storage: 1Mi}}}}}}""")
PY
  k apply -f "$work/pvcs.yaml" > /dev/null
  all_bound() { [[ $(count_phase Bound) -ge $churn ]]; }
  until_or 300 all_bound || echo "fleet: not all $churn claims bound after 300 s" >&2
  sleep 2
  # The UIDs the PVs have now (bound), not those picked (Available).
  released=$(py pvs "$work/watch.log" | python3 -c "import json,sys; now=json.load(sys.stdin); print(json.dumps({n: now[n][0] for n in json.loads(sys.argv[1]) if n in now}))" "$released")
  churn_phase released "$released" k delete pvc -n default -l bench=churn --wait=false > "$work/released.json"
  cat "$work/released.json"
  deleted=$(py pick "$work/watch.log" "$churn" "$churn")
  mapfile -t doomed < <(python3 -c "import json,sys; print('\\n'.join(json.loads(sys.argv[1])))" "$deleted")
  churn_phase deleted "$deleted" k delete pv --wait=false "${doomed[@]}" > "$work/deleted.json"
  cat "$work/deleted.json"
fi

# ---- table ----
python3 - "$work" "$churn" <<'PY'
import json, os, sys
work, churn = sys.argv[1], int(sys.argv[2])
idle = json.load(open(f"{work}/idle.json"))
print("%-10s %-9s %7s %6s %14s %22s %20s %16s %14s" % ("impl", "phase", "agents", "pvs", "seconds", "agents_cpu_s/min", "apiserver_cpu_s", "agent_req/min", "mean_rss_MiB"))
print("%-10s %-9s %7s %6s %14s %22s %20s %16s %14s" % (idle["impl"], "idle", idle["agents"], idle["pvs"], idle["seconds"],
      idle["agents_cpu_s_per_min"], idle["apiserver_cpu_s"], idle["agent_requests_per_min"], idle["mean_agent_rss_mib"]))
print("  idle inventory writes/min (LocalStorageNode status; goal 0):", idle.get("inventory_writes_per_min", 0))
print("  idle requests by verb+resource:", ", ".join(f"{k} {n}" for k, n in idle["requests_by"].items()) or "none")
for kind in ("released", "deleted") if churn else ():
    path = f"{work}/{kind}.json"
    if not os.path.getsize(path):
        continue
    c = json.load(open(path))
    print(f"  per {kind} PV ({c['renewed']}/{c['pvs']} back in {c['seconds_until_all_back']} s): {c['requests_per_pv']} requests "
          f"({c['requests_per_pv_net_of_idle']} net of idle), apiserver {c['apiserver_cpu_s_per_pv']} CPU-s")
    print("    by verb+resource:", ", ".join(f"{k} {n}" for k, n in c["per_pv_by"].items()))
PY
restarts=$(grep -c "started again" "$work/watch.err" || true)
(( restarts == 0 )) || { echo "fleet: the PV watch ended and was started again $restarts times; last errors:"; grep -v "started again" "$work/watch.err" | tail -3; } >&2
