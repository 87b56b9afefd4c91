#!/usr/bin/env bash
# Benchmark (not a test): one agent with V volumes (default 10) while the cluster holds F PVs
# of other nodes (default 20,000, created directly through the API). Reports the agent's
# resident memory and the watch events it received, first with no foreign PVs and then with F:
# the label-scoped watch means neither may grow with F. Needs root.
v=${1:-10}
f=${2:-20000}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
for i in $(seq 1 "$v"); do mkdir -p "$work/disks/v$i"; mount -t tmpfs -o size=16m tmpfs "$work/disks/v$i"; done

# measure LABEL: idle 20 s, then report VmRSS/VmHWM and the PV watch events the agent received
# (counted from its debug log: one "watch event" line per event).
measure() {
  sleep 20
  local rss hwm events
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$agent_pid/status")
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$agent_pid/status")
  events=$(grep -c "persistentvolumes watch event" "$work/agent.log" || true)
  echo "{\"figure\":\"scale_foreign_pvs\",\"foreign_pvs\":$1,\"own_volumes\":$v,\"rss_kib\":$rss,\"vmhwm_kib\":$hwm,\"pv_watch_events\":$events}"
}

RUST_LOG=warn,local_static_provisioner::agent=trace start_agent 2> "$work/agent.log"
until [[ $(k get pv -o name | wc -l) -ge $v ]]; do sleep 0.2; done
base=$(measure 0)

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
with=$(measure "$f")
echo "$base"
echo "$with"
python3 - "$base" "$with" "$created" <<'PY'
import json, sys
b, w = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"{'foreign_pvs':>12} {'rss_MiB':>8} {'peak_MiB':>9} {'pv_watch_events':>16}")
for r in (b, w):
    print(f"{r['foreign_pvs']:>12} {r['rss_kib']/1024:>8.1f} {r['vmhwm_kib']/1024:>9.1f} {r['pv_watch_events']:>16}")
print(f"(creating {w['foreign_pvs']} foreign PVs took {sys.argv[3]} s)")
PY
