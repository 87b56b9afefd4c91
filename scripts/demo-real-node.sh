#!/usr/bin/env bash
# `scripts/demo.sh --real-node`: the control plane and a real node on this machine, deploy/
# applied as users apply it, three tmpfs disks published as PVs, and a pod writing to one of
# them through its claim. Runs until Ctrl-C (or DEMO_SECONDS); everything is undone on exit
# (tests/node/stop.sh restores the host).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
demo=${DEMO_DIR:-/tmp/local-static-provisioner-demo}
mkdir -p "$demo"
disks=()
cleanup() {
  for d in "${disks[@]}"; do umount "$d" 2> /dev/null; rmdir "$d" 2> /dev/null; done
  bash "$repo/tests/node/stop.sh" "$demo/node"
  bash "$repo/tests/control-plane/stop.sh" "$demo/control-plane"
}
trap cleanup EXIT

echo "== building the control plane, kubelet and the container runtime (first time takes minutes)"
rm -rf "$demo/control-plane" "$demo/node"
bash "$repo/tests/control-plane/start.sh" "$demo/control-plane"
echo "== a real node: kubelet, containerd, runc; images assembled here and imported"
bash "$repo/tests/node/start.sh" "$demo/node" "$demo/control-plane"
# shellcheck disable=SC1091
source "$demo/control-plane/env"
# shellcheck disable=SC1091
source "$demo/node/env"
kubectl() { "$CONTROL_PLANE_BIN/kubectl" "$@"; }

echo "== deploy/ applied (overlay: image, API address, ports)"
bash "$repo/tests/node/overlay.sh" "$demo/overlay" "$demo/control-plane" > /dev/null
kubectl apply -k "$demo/overlay" > /dev/null
kubectl -n local-static-provisioner rollout status daemonset/local-static-provisioner --timeout=120s

echo "== three tmpfs disks mounted under /mnt/fast-disks (after the agent started)"
for v in demo1 demo2 demo3; do
  mkdir -p "/mnt/fast-disks/$v"
  mount -t tmpfs -o size=$((RANDOM % 64 + 16))m tmpfs "/mnt/fast-disks/$v"
  disks+=("/mnt/fast-disks/$v")
done
for _ in $(seq 1 50); do
  [[ $(kubectl get pv -o name | wc -l) -ge 3 ]] && break
  sleep 0.2
done
kubectl get pv -o wide

echo "== a pod writes to one of them through a claim"
kubectl apply -f - > /dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: demo-claim, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: fast-disks
  resources: {requests: {storage: 10Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: demo-app, namespace: default}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 5
  containers:
    - name: app
      image: $SHELL_IMAGE
      imagePullPolicy: Never
      command: ["sh", "-c", "date > /data/hello && echo wrote /data/hello && df -h /data && trap 'exit 0' TERM; sleep 3600 & wait"]
      volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: demo-claim}}]
YAML
kubectl wait --for=condition=Ready pod/demo-app --timeout=120s > /dev/null
kubectl get pod,pvc -o wide
pv=$(kubectl get pvc demo-claim -o jsonpath='{.spec.volumeName}')
echo "-- the pod's output (kubelet's log files: the node has no address for kubectl logs)"
cat "$POD_LOGS_DIR"/default_demo-app_*/app/0.log | cut -d' ' -f4-
echo "-- on the host, the disk behind $pv: $(kubectl get pv "$pv" -o jsonpath='{.spec.local.path}')"
ls -l "$(kubectl get pv "$pv" -o jsonpath='{.spec.local.path}')"
echo "== running; KUBECONFIG=$KUBECONFIG. Try: kubectl delete pod demo-app; kubectl delete pvc demo-claim"
echo "   (the agent wipes the disk once kubelet has unmounted it and publishes it again)"
if [[ -n "${DEMO_SECONDS:-}" ]]; then sleep "$DEMO_SECONDS"; else sleep infinity; fi
