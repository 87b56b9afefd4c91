#!/usr/bin/env bash
# Benchmark (not a test): a PV whose volume holds N files (default 10,000) is bound, then its
# claim is deleted; time from the claim's deletion until the same PV name is Available again
# (wiped, deleted, published anew), and the agent's requests for that cycle (from the claim's
# deletion until 4 s after the PV is back, from the API server's audit log, by verb+resource):
# all of them, and those for the PV alone (without the node inventory's writes and the
# heartbeat Lease's renewals, which do not come with each PV). Needs root. Prints a JSON line
# and a readable table.
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
# Anything the cycle still causes (the inventory's write waits up to 3 s for the cycle's end).
sleep 4
user=system:serviceaccount:local-static-provisioner:local-static-provisioner
req=$(python3 "$(dirname "${BASH_SOURCE[0]}")/fleet.py" requests "$work/cp/logs/audit.log" "$user" "$start" "$(now)")
python3 - "$n" "$secs" "$req" <<'PY'
import json, sys
n, secs, req = int(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3])
by = {k: v for k, v in req["by"].items() if not k.startswith("watch ")}
inventory = sum(v for k, v in by.items() if "localstoragenodes" in k)
lease = sum(v for k, v in by.items() if k.endswith(" leases"))
total = sum(by.values())
print(json.dumps({"figure": "recycle_latency", "files": n, "seconds": secs, "requests_per_released_pv": total,
                  "pv_requests": total - inventory - lease, "inventory_writes": inventory, "lease_renewals": lease,
                  "requests_by": by}, separators=(",", ":")))
print("%-16s %8s %10s %10s %12s %10s %8s" % ("figure", "files", "seconds", "requests", "pv_requests", "inventory", "lease"))
print("%-16s %8s %10s %10s %12s %10s %8s" % ("recycle_latency", n, secs, total, total - inventory - lease, inventory, lease))
print("  by verb+resource:", ", ".join(f"{k} {v}" for k, v in by.items()) or "none")
PY
