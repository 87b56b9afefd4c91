#!/usr/bin/env bash
# Benchmark (not a test): one agent with V volumes (default 10) while the cluster holds F PVs
# of other nodes (default 20,000, created directly through the API). Reports the agent's
# resident memory (now and peak, VmHWM) and the watch events it received: for an agent started
# before the foreign PVs exist, with none and then with F (the label-scoped watch means neither
# may grow with F); then for a second agent started after they exist, whose start-up adoption
# reads every PV of the cluster. Needs root.
v=${1:-10}
f=${2:-20000}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
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
echo "$base"
echo "$with"
echo "$after"
python3 - "$base" "$with" "$after" "$created" <<'PY'
import json, sys
rows = [json.loads(a) for a in sys.argv[1:4]]
print(f"{'foreign_pvs':>12} {'agent_started':>14} {'rss_MiB':>8} {'anon_MiB':>9} {'peak_MiB':>9} {'pv_watch_events':>16}")
for r in rows:
    print(f"{r['foreign_pvs']:>12} {r['agent_started'] + ' them':>14} {r['rss_kib']/1024:>8.1f} {r['rss_anon_kib']/1024:>9.1f} "
          f"{r['vmhwm_kib']/1024:>9.1f} {r['pv_watch_events']:>16}")
print(f"(creating {rows[1]['foreign_pvs']} foreign PVs took {sys.argv[4]} s)")
PY
