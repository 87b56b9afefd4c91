#!/usr/bin/env bash
# The local demo: the agent against a real local control plane, with real tmpfs mounts as
# disks. Needs root (it mounts). It builds (or reuses) the control plane, creates a fake Ready
# node and a StorageClass, mounts three volumes under $DEMO_DIR/disks, shows `discover`, then
# runs the agent under the ServiceAccount and RBAC from deploy/ until Ctrl-C (or for
# DEMO_SECONDS seconds when set). Everything it started or mounted is undone on exit.
#
# With --real-node, the agent runs as users run it: a real node (kubelet, containerd, runc;
# tests/node/) joins the cluster, deploy/ is applied (tests/node/overlay.sh: image, API
# address, ports), three tmpfs disks appear under /mnt/fast-disks, and a pod writes to one
# through its claim. Host effects while it runs, all undone on exit: /var/lib/kubelet, the
# sysctls kubelet sets, /mnt/fast-disks and /mnt/block-disks as shared mounts.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
demo=${DEMO_DIR:-/tmp/local-static-provisioner-demo}
node=${DEMO_NODE:-demo-node}
[[ $(id -u) == 0 ]] || { echo "demo: run as root (it mounts tmpfs volumes)" >&2; exit 1; }
real_node=0
[[ ${1:-} == --real-node ]] && real_node=1
# shellcheck source=scripts/toolchain.sh
source "$repo/scripts/toolchain.sh"
lsp_find_toolchains || exit 1  # here too: install-deps.sh runs in a process of its own
bash "$repo/scripts/install-deps.sh"
(( real_node )) && exec bash "$repo/scripts/demo-real-node.sh"

mkdir -p "$demo"
agent_pid=""
cleanup() {
  [[ -n "$agent_pid" ]] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  for v in "$demo"/disks/*; do mountpoint -q "$v" && umount "$v"; done
  bash "$repo/tests/control-plane/stop.sh" "$demo/control-plane"
}
trap cleanup EXIT

# What is built, said up front; each stage then says it started, every minute that it still runs
# (or waits for another build's lock) and how long it took.
built_at=$(date +%s)
echo "== building the agent (release; the first time about 8 minutes on 2 cores) and the control plane (the first time about 6 minutes, then cached)"
# The commit's date, as scripts/build-image.sh builds it: one release build serves both.
SOURCE_DATE_EPOCH=$(lsp_source_date_epoch "$repo")
export SOURCE_DATE_EPOCH
(cd "$repo" && lsp_stage demo "the agent (cargo build --release)" cargo build --release --locked -q)
bin=$(lsp_release_binary "$repo")
rm -rf "$demo/control-plane"  # a fresh cluster each time
bash "$repo/tests/control-plane/start.sh" "$demo/control-plane"
echo "== built and started in $(( $(date +%s) - built_at )) s"
# shellcheck disable=SC1091
source "$demo/control-plane/env"
kubectl() { "$CONTROL_PLANE_BIN/kubectl" "$@"; }

echo "== a fake Ready node '$node' and the StorageClass"
kubectl apply -f - > /dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $node
  labels: {kubernetes.io/hostname: $node}
YAML
kubectl patch node "$node" --subresource=status --type=merge -p \
  '{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"demo"}],"allocatable":{"cpu":"4","memory":"8Gi","pods":"110"},"capacity":{"cpu":"4","memory":"8Gi","pods":"110"}}}' > /dev/null
kubectl patch node "$node" --type=json -p '[{"op":"remove","path":"/spec/taints"}]' > /dev/null 2>&1 || true
kubectl apply -f "$repo/deploy/base/storageclass.yaml" > /dev/null

echo "== three tmpfs volumes under $demo/disks"
for v in vol1 vol2 vol3; do
  mkdir -p "$demo/disks/$v"
  mountpoint -q "$demo/disks/$v" || mount -t tmpfs -o size=$((RANDOM % 64 + 16))m tmpfs "$demo/disks/$v"
done
mkdir -p "$demo/config"
cat > "$demo/config/storageClassMap" <<YAML
fast-disks:
  hostDir: $demo/disks
  mountDir: $demo/disks
YAML

echo "== discover (dry run, no cluster)"
"$bin" discover --config-dir "$demo/config" --node-name "$node"

echo "== the agent, as the ServiceAccount from deploy/"
bash "$repo/tests/control-plane/agent-kubeconfig.sh" "$demo/control-plane" "$demo/agent.kubeconfig"
"$bin" run --config-dir "$demo/config" --node-name "$node" --kubeconfig "$demo/agent.kubeconfig" \
  --state-dir "$demo/state" &
agent_pid=$!
for _ in $(seq 1 50); do
  [[ $(kubectl get pv -o name | wc -l) -ge 3 ]] && break
  sleep 0.2
done
kubectl get pv -o wide
echo "== the node's inventory (LocalStorageNode), and the kubectl plugin (the same binary as kubectl-local_storage)"
for _ in $(seq 1 50); do
  [[ $(kubectl get localstoragenode "$node" -o 'jsonpath={.status.summary.available}' 2> /dev/null) == 3 ]] && break
  sleep 0.2
done
kubectl get localstoragenodes
mkdir -p "$demo/bin"
ln -sf "$bin" "$demo/bin/kubectl-local_storage"
PATH="$demo/bin:$CONTROL_PLANE_BIN:$PATH" "$CONTROL_PLANE_BIN/kubectl" local-storage volumes
# This machine's disks, listed without probing (no class of the demo claims devices).
PATH="$demo/bin:$CONTROL_PLANE_BIN:$PATH" "$CONTROL_PLANE_BIN/kubectl" local-storage disks
echo "== agent running (pid $agent_pid); KUBECONFIG=$KUBECONFIG; mount more tmpfs under $demo/disks to see new PVs"
if [[ -n "${DEMO_SECONDS:-}" ]]; then sleep "$DEMO_SECONDS"; else wait "$agent_pid"; fi
