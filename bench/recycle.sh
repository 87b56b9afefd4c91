#!/usr/bin/env bash
# Benchmark (not a test): a PV whose volume holds N files (default 10,000) is bound, then its
# claim is deleted; time from the claim's deletion until the same PV name is Available again
# (wiped, deleted, published anew). Needs root. Prints a JSON line and a readable line.
n=${1:-10000}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
mkdir -p "$work/disks/vol"
mount -t tmpfs -o size=512m tmpfs "$work/disks/vol"
start_agent
until [[ $(k get pv -o name | wc -l) -ge 1 ]]; do sleep 0.1; done
pv=$(k get pv -o jsonpath='{.items[0].metadata.name}')
k apply -f - > /dev/null <<'YAML'
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: bench-claim, namespace: default}
spec: {accessModes: [ReadWriteOnce], storageClassName: fast-disks, resources: {requests: {storage: 1Mi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: bench-pod, namespace: default}
spec:
  containers: [{name: app, image: registry.k8s.io/pause:3.10}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: bench-claim}}]
YAML
until [[ $(k get pvc bench-claim -o jsonpath='{.status.phase}') == Bound ]]; do sleep 0.1; done
old_uid=$(k get pv "$pv" -o jsonpath='{.metadata.uid}')
python3 - "$work/disks/vol" "$n" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, f"d{i // 100}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i}"), "wb") as f:
        f.write(b"x" * 128)
PY
k delete pod bench-pod --grace-period=0 --force > /dev/null 2>&1
start=$(now)
k delete pvc bench-claim --wait=false > /dev/null
while :; do
  state=$(k get pv "$pv" -o jsonpath='{.metadata.uid} {.status.phase}' 2>/dev/null || true)
  [[ "$state" != "$old_uid "* && "$state" == *" Available" ]] && break
  sleep 0.05
done
secs=$(elapsed "$start" "$(now)")
echo "{\"figure\":\"recycle_latency\",\"files\":$n,\"seconds\":$secs}"
printf '%-16s %8s %10s\n' figure files seconds
printf '%-16s %8s %10s\n' recycle_latency "$n" "$secs"
