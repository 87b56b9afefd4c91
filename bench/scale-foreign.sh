#!/usr/bin/env bash
# Benchmark (not a test): one agent with V volumes (default 10) while the cluster holds F PVs
# of other nodes (default 20,000, created directly through the API). Reports the agent's
# resident memory (now and peak, VmHWM) and the watch events it received: for an agent started
# before the foreign PVs exist, with none and then with F (the label-scoped watch means neither
# may grow with F); then for a second agent started after they exist, whose start-up adoption
# reads every PV of the cluster. Then start-up among them: an agent for a fresh Node with V
# fresh volumes, ours and upstream's v2.9.0 (IMPL=ours|upstream|both, default both), each in a
# mount namespace of its own (as in bench/fleet.sh): seconds from its start until its V PVs
# exist (the API server answered its V creates, from the audit log), its peak RSS by then, and
# (ours) the unfiltered PV list pages it asked for. Needs root.
v=${1:-10}
f=${2:-20000}
impl=${IMPL:-both}
[[ $impl == ours || $impl == upstream || $impl == both ]] || { echo "IMPL must be ours, upstream or both" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
up_bin=""
if [[ $impl != ours ]]; then
  up_bin=$(bash "$here/upstream/build.sh")/local-volume-provisioner || exit 1
fi
source "$here/lib.sh"
for i in $(seq 1 "$v"); do mkdir -p "$work/disks/v$i"; mount -t tmpfs -o size=16m tmpfs "$work/disks/v$i"; done

# measure FOREIGN STARTED LOG: idle 20 s, then report VmRSS/VmHWM and the PV watch events the
# agent received (counted from its trace log: one "watch event" line per event).
measure() {
  sleep 20
  local rss hwm anon events
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$agent_pid/status")
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$agent_pid/status")
  anon=$(awk '/RssAnon/ {print $2}' "/proc/$agent_pid/status")
  events=$(grep -c "persistentvolumes watch event" "$3" || true)
  echo "{\"figure\":\"scale_foreign_pvs\",\"foreign_pvs\":$1,\"agent_started\":\"$2\",\"own_volumes\":$v,\"rss_kib\":$rss,\"vmhwm_kib\":$hwm,\"rss_anon_kib\":$anon,\"pv_watch_events\":$events}"
}
trace=warn,local_static_provisioner::runtime=trace

RUST_LOG=$trace start_agent 2> "$work/agent.log"
until [[ $(k get pv -o name | wc -l) -ge $v ]]; do sleep 0.2; done
base=$(measure 0 before "$work/agent.log")

# F PVs of other nodes, through the API (server-side apply of a List in chunks of 500).
python3 - "$f" > "$work/foreign.json" <<'PY'
import json, sys
n = int(sys.argv[1])
items = [{"apiVersion": "v1", "kind": "PersistentVolume",
          "metadata": {"name": f"foreign-{i}", "labels": {"local-static-provisioner.io/node": f"other-{i % 500}"},
                       "annotations": {"pv.kubernetes.io/provisioned-by": f"local-volume-provisioner-other-{i % 500}-x"}},
          "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "fast-disks",
                   "local": {"path": f"/mnt/other/{i}"},
                   "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                       {"key": "kubernetes.io/hostname", "operator": "In", "values": [f"other-{i % 500}"]}]}]}}}}
         for i in range(n)]
for start in range(0, n, 500):
    print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items[start:start + 500]}))
PY
start=$(now)
while read -r chunk; do echo "$chunk" | k create -f - > /dev/null; done < "$work/foreign.json"
created=$(elapsed "$start" "$(now)")
with=$(measure "$f" before "$work/agent.log")

# A second agent, for the same node, started once the F foreign PVs exist.
kill "$agent_pid" && wait "$agent_pid" || true
RUST_LOG=$trace start_agent 2> "$work/agent-after.log"
after=$(measure "$f" after "$work/agent-after.log")
kill "$agent_pid" && wait "$agent_pid" || true
agent_pid=""

# ---- start-up among the F foreign PVs ----
# startup IMPL: a fresh Node startup-IMPL with V fresh tmpfs volumes, mounted in the agent's own
# mount namespace (they vanish with it), its own config and state dir; upstream's config is
# bound at its fixed /etc/provisioner/config there. Prints the figure's JSON line.
node_sh='d=$1; n=$2; cfg=$3; shift 3
i=1; while [ "$i" -le "$n" ]; do mount -t tmpfs -o size=16m tmpfs "$d/v$i" || exit 1; i=$((i + 1)); done
[ -z "$cfg" ] || mount --bind "$cfg" /etc/provisioner/config || exit 1
exec "$@"'
startup() {
  local who=$1 node=startup-$1 d=$work/startup-$1 t0 hwm pages pid secs
  local user=system:serviceaccount:local-static-provisioner:local-static-provisioner
  mkdir -p "$d/config" "$d/state"
  for i in $(seq 1 "$v"); do mkdir -p "$d/vols/v$i"; done
  printf 'fast-disks:\n  hostDir: %s\n  mountDir: %s\n' "$d/vols" "$d/vols" > "$d/config/storageClassMap"
  printf 'apiVersion: v1\nkind: Node\nmetadata: {name: %s, labels: {kubernetes.io/hostname: %s}}\n' "$node" "$node" \
    | k apply -f - > /dev/null
  k patch node "$node" --subresource=status --type=merge -p \
    '{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"bench"}]}}' > /dev/null
  t0=$EPOCHREALTIME
  if [[ $who == ours ]]; then
    RUST_LOG=warn unshare -m --propagation private sh -c "$node_sh" sh "$d/vols" "$v" "" "$bin" run \
      --listen-address 127.0.0.1:0 --config-dir "$d/config" --node-name "$node" \
      --kubeconfig "$work/agent.kubeconfig" --state-dir "$d/state" 2> "$d/agent.log" &
  else
    MY_NODE_NAME=$node MY_NAMESPACE=local-static-provisioner KUBECONFIG=$work/agent.kubeconfig \
      unshare -m --propagation private sh -c "$node_sh" sh "$d/vols" "$v" "$d/config" "$up_bin" \
      --listen-address=127.0.0.1:0 2> "$d/agent.log" &
  fi
  pid=$!
  agent_pid=$pid
  # Created: the API server answered the agent's create (the audit log: a PV watch would lag
  # by its own initial list of the F foreign PVs). Only this agent runs, as the ServiceAccount.
  creates() {
    python3 -c '
import json, sys
from datetime import datetime
t0, user, node = float(sys.argv[2]), sys.argv[3], sys.argv[4]
done, pages = [], 0
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("user", {}).get("username") != user:
        continue
    at = datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
    uri, verb = e.get("requestURI", ""), e.get("verb")
    if at < t0:
        continue
    if verb == "create" and uri.startswith("/api/v1/persistentvolumes") and e.get("responseStatus", {}).get("code") == 201:
        done.append(datetime.fromisoformat(e["stageTimestamp"].replace("Z", "+00:00")).timestamp())
    # Lists of every PV, unfiltered (no label selector): the pages of adoption.
    if verb == "list" and uri.startswith("/api/v1/persistentvolumes?") and "labelSelector" not in uri:
        pages += 1
done.sort()
print(len(done), round(done[-1] - t0, 2) if done else "null", pages)' "$work/cp/logs/audit.log" "$t0" "$user" "$node"
  }
  local deadline=$((SECONDS + 300)) got=(0 null 0)
  until (( got[0] >= v )); do
    (( SECONDS < deadline )) || { echo "scale-foreign: $who: not all $v PVs after 300 s" >&2; break; }
    sleep 0.5
    read -r -a got <<< "$(creates)"
  done
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
  kill "$pid" && wait "$pid" || true
  agent_pid=""
  secs=${got[1]}
  pages=${got[2]}
  [[ $who == ours ]] || pages=null
  echo "{\"figure\":\"scale_foreign_startup\",\"impl\":\"$who\",\"foreign_pvs\":$f,\"own_volumes\":$v,\"seconds_to_all_pvs\":$secs,\"vmhwm_kib\":$hwm,\"unfiltered_pv_list_pages\":$pages}"
}
made_etc=""
if [[ $impl != ours ]]; then
  upstream_node_rbac
  if [[ ! -d /etc/provisioner/config ]]; then mkdir -p /etc/provisioner/config; made_etc=1; fi
fi
: > "$work/starts"
# Not in a subshell: the cleanup trap must see each agent's PID while it runs.
if [[ $impl != upstream ]]; then startup ours >> "$work/starts"; fi
if [[ $impl != ours ]]; then startup upstream >> "$work/starts"; fi
if [[ -n "$made_etc" ]]; then rmdir /etc/provisioner/config /etc/provisioner 2> /dev/null || true; fi
mapfile -t starts < "$work/starts"

echo "$base"
echo "$with"
echo "$after"
for s in "${starts[@]}"; do echo "$s"; done
python3 - "$base" "$with" "$after" "$created" <<'PY'
import json, sys
rows = [json.loads(a) for a in sys.argv[1:4]]
print(f"{'foreign_pvs':>12} {'agent_started':>14} {'rss_MiB':>8} {'anon_MiB':>9} {'peak_MiB':>9} {'pv_watch_events':>16}")
for r in rows:
    print(f"{r['foreign_pvs']:>12} {r['agent_started'] + ' them':>14} {r['rss_kib']/1024:>8.1f} {r['rss_anon_kib']/1024:>9.1f} "
          f"{r['vmhwm_kib']/1024:>9.1f} {r['pv_watch_events']:>16}")
print(f"(creating {rows[1]['foreign_pvs']} foreign PVs took {sys.argv[4]} s)")
PY
python3 - "${starts[@]}" <<'PY'
import json, sys
print(f"{'start-up':>10} {'seconds_to_all_pvs':>19} {'peak_MiB':>9} {'unfiltered_pv_lists':>20}")
for r in map(json.loads, sys.argv[1:]):
    print(f"{r['impl']:>10} {str(r['seconds_to_all_pvs']):>19} {r['vmhwm_kib']/1024:>9.1f} {str(r['unfiltered_pv_list_pages']):>20}")
PY
