#!/usr/bin/env bash
# Benchmark (not a test): a deleted Node with N local PVs (default 500), C of them bound to
# claims (default 100). node-cleanup runs with its own RBAC and a 1 s grace period; measured:
# time from the Node's deletion until every claim and PV of it is gone, node-cleanup's peak
# RSS, and its API requests. Needs root (shared set-up). Prints a JSON line and a table.
n=${1:-500}
claims=${2:-100}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
k apply -f - > /dev/null <<'YAML'
apiVersion: v1
kind: Node
metadata: {name: doomed-node, labels: {kubernetes.io/hostname: doomed-node}}
YAML
python3 - "$n" "$claims" > "$work/objects.yaml" <<'PY'
import sys
n, claims = int(sys.argv[1]), int(sys.argv[2])
uid = "0f0e1d2c-3b4a-5968-7786-95a4b3c2d1e0"
for i in range(n):
    print(f"""---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: doomed-pv-{i}
  annotations: {{pv.kubernetes.io/provisioned-by: local-volume-provisioner-doomed-node-{uid}}}
  labels: {{local-static-provisioner.io/node: doomed-node}}
  finalizers: [local-static-provisioner.io/wipe]
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Delete
  storageClassName: fast-disks
  local: {{path: /mnt/fast-disks/d{i}}}
  nodeAffinity: {{required: {{nodeSelectorTerms: [{{matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [doomed-node]}}]}}]}}}}""")
for i in range(claims):
    print(f"""---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: doomed-claim-{i}, namespace: default}}
spec: {{accessModes: [ReadWriteOnce], storageClassName: fast-disks, volumeName: doomed-pv-{i}, resources: {{requests: {{storage: 1Gi}}}}}}""")
PY
k apply -f "$work/objects.yaml" > /dev/null
until [[ $(k get pvc -n default --no-headers 2>/dev/null | grep -c Bound) -ge $claims ]]; do sleep 0.5; done
bash "$repo/tests/control-plane/agent-kubeconfig.sh" "$work/cp" "$work/nc.kubeconfig" node-cleanup
RUST_LOG=warn "$bin" node-cleanup --storage-classes fast-disks --grace-period 1s --resync-period 1s \
  --listen-address 127.0.0.1:0 --kubeconfig "$work/nc.kubeconfig" --lease-name bench &
agent_pid=$!
sleep 3 # leadership and the PV watch
start=$(now)
k delete node doomed-node > /dev/null
while [[ $(k get pv --no-headers 2>/dev/null | grep -c doomed-pv) -gt 0 || \
         $(k get pvc -n default --no-headers 2>/dev/null | grep -c doomed-claim) -gt 0 ]]; do sleep 0.2; done
secs=$(elapsed "$start" "$(now)")
rss_kib=$(awk '/VmHWM/ {print $2}' "/proc/$agent_pid/status")
requests=$(python3 - "$work/cp/logs/audit.log" <<'PY'
import json, sys
user = "system:serviceaccount:local-static-provisioner:local-static-provisioner-node-cleanup"
print(sum(1 for l in open(sys.argv[1]) if json.loads(l).get("user", {}).get("username") == user))
PY
)
echo "{\"figure\":\"node_cleanup\",\"pvs\":$n,\"claims\":$claims,\"grace_seconds\":1,\"seconds\":$secs,\"peak_rss_kib\":$rss_kib,\"api_requests\":$requests}"
printf '%-14s %6s %7s %8s %14s %13s\n' figure pvs claims seconds peak_rss_mib api_requests
printf '%-14s %6s %7s %8s %14s %13s\n' node_cleanup "$n" "$claims" "$secs" "$((rss_kib / 1024))" "$requests"
