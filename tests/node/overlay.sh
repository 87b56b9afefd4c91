#!/usr/bin/env bash
# Writes a kustomize overlay of deploy/base and deploy/node-cleanup, as shipped, for the real
# test node, changing only what this machine forces and what an operator adds:
#   - the image: the agent image tests/node/images/build.sh assembled (tag e2e, never pulled);
#   - the API address: pods use the host's network (the node runs no CNI network and no
#     kube-proxy), with KUBERNETES_SERVICE_HOST/PORT pointing at the API server on loopback;
#   - ports: the admin servers on free loopback ports (host network);
#   - a second StorageClass, block-disks (volumeMode Block, /mnt/block-disks), with its entry in
#     the ConfigMap, its hostPath and its root in the admission policy, as an operator adds a class;
#   - a third, claimed-disks (Filesystem, ext4, /mnt/claimed-disks), whose devices section claims
#     loop devices of exactly 57 MiB (a size no other test uses), the same way, and with it
#     deploy/components/host-pid (claims need the host's processes), as an operator adds it;
#   - a fourth, encrypted-disks (Filesystem, /mnt/encrypted-disks, encryption: fscrypt: each
#     volume's data under its own key, docs/encryption.md), the same way;
#   - deploy/components/startup-taint with the key lsp-e2e.example.com/storage-not-ready
#     (upstream's removeNodeNotReadyTaint), as an operator whose node pool taints new Nodes.
# LSP_AGENT_RUST_LOG, when set, is the agent's RUST_LOG (more detail while a test is diagnosed).
# Usage: overlay.sh OUT_DIR CONTROL_PLANE_DIR   then `kubectl apply -k OUT_DIR`
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:?usage: overlay.sh OUT_DIR CONTROL_PLANE_DIR}
cp_dir=${2:?usage: overlay.sh OUT_DIR CONTROL_PLANE_DIR}
# shellcheck disable=SC1091
source "$cp_dir/env"
api=${API_URL#https://}
api_host=${api%:*} api_port=${api##*:}
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
agent_port=${AGENT_PORT:-$(free_port)}
cleanup_port=${NODE_CLEANUP_PORT:-$(free_port)}
mkdir -p "$out"
agent_log_env=""
if [ -n "${LSP_AGENT_RUST_LOG:-}" ]; then
  agent_log_env="            - {name: RUST_LOG, value: \"$LSP_AGENT_RUST_LOG\"}"
fi
out=$(cd "$out" && pwd)
# kustomize takes only relative paths to bases.
rel=$(python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$repo" "$out")

cat > "$out/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $rel/deploy/base
  - $rel/deploy/node-cleanup
  - block-storageclass.yaml
  - claimed-storageclass.yaml
  - encrypted-storageclass.yaml
  - startup-taint.yaml
components:
  - $rel/deploy/components/host-pid
  - $rel/deploy/components/startup-taint
images:
  - name: local-static-provisioner
    newTag: e2e
patches:
  - path: agent.yaml
  - path: node-cleanup.yaml
  - path: configmap.yaml
  # Ports are merged by number: replace the shipped one in place.
  - target: {kind: DaemonSet, name: local-static-provisioner}
    patch: '[{"op": "replace", "path": "/spec/template/spec/containers/0/ports/0/containerPort", "value": $agent_port}]'
  - target: {kind: Deployment, name: local-static-provisioner-node-cleanup}
    patch: '[{"op": "replace", "path": "/spec/template/spec/containers/0/ports/0/containerPort", "value": $cleanup_port}]'
  # The admission policy's discovery roots follow the ConfigMap's hostDirs (as documented there).
  - target: {kind: ValidatingAdmissionPolicy, name: local-static-provisioner-node-scope}
    patch: |
      - op: replace
        path: /spec/variables/0/expression
        value: "['/mnt/fast-disks', '/mnt/block-disks', '/mnt/claimed-disks', '/mnt/encrypted-disks']"
      - op: replace
        path: /spec/variables/1/expression
        value: "['/mnt/encrypted-disks']"
YAML

cat > "$out/agent.yaml" <<YAML
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: local-static-provisioner, namespace: local-static-provisioner}
spec:
  template:
    spec:
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      containers:
        - name: provisioner
          # As deploy/ has them, on the host network's loopback.
          args: ["run", "--listen-address", "127.0.0.1:$agent_port", "--install-boot-fence"]
          env:
            - {name: KUBERNETES_SERVICE_HOST, value: "$api_host"}
            - {name: KUBERNETES_SERVICE_PORT, value: "$api_port"}
$agent_log_env
          volumeMounts:
            - {name: block-disks, mountPath: /mnt/block-disks, mountPropagation: HostToContainer}
            - {name: claimed-disks, mountPath: /mnt/claimed-disks, mountPropagation: HostToContainer}
            - {name: encrypted-disks, mountPath: /mnt/encrypted-disks, mountPropagation: HostToContainer}
      volumes:
        - {name: block-disks, hostPath: {path: /mnt/block-disks}}
        - {name: claimed-disks, hostPath: {path: /mnt/claimed-disks}}
        - {name: encrypted-disks, hostPath: {path: /mnt/encrypted-disks}}
YAML

cat > "$out/node-cleanup.yaml" <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: local-static-provisioner-node-cleanup, namespace: local-static-provisioner}
spec:
  template:
    spec:
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      containers:
        - name: node-cleanup
          env:
            - {name: KUBERNETES_SERVICE_HOST, value: "$api_host"}
            - {name: KUBERNETES_SERVICE_PORT, value: "$api_port"}
            - {name: LISTEN_ADDRESS, value: "127.0.0.1:$cleanup_port"}
YAML

# The shipped class, unchanged, and the operator's block class.
shipped=$(awk '/^  storageClassMap: \|/ {on=1; next} on && /^    / {print} on && !/^    / {on=0}' \
  "$repo/deploy/base/configmap.yaml")
[[ -n $shipped ]] || { echo "overlay: no storageClassMap in deploy/base/configmap.yaml" >&2; exit 1; }
{
  cat <<YAML
apiVersion: v1
kind: ConfigMap
metadata: {name: local-provisioner-config, namespace: local-static-provisioner}
data:
  storageClassMap: |
YAML
  echo "$shipped"
  cat <<YAML
    block-disks:
      hostDir: /mnt/block-disks
      mountDir: /mnt/block-disks
      volumeMode: Block
    claimed-disks:
      hostDir: /mnt/claimed-disks
      mountDir: /mnt/claimed-disks
      volumeMode: Filesystem
      fsType: ext4
      devices:
        types: [loop]
        minSize: 57Mi
        maxSize: 57Mi
    encrypted-disks:
      hostDir: /mnt/encrypted-disks
      mountDir: /mnt/encrypted-disks
      encryption: fscrypt
YAML
} > "$out/configmap.yaml"

cat > "$out/startup-taint.yaml" <<YAML
apiVersion: v1
kind: ConfigMap
metadata:
  name: local-static-provisioner-startup-taint
  annotations:
    config.kubernetes.io/local-config: "true"
data:
  key: lsp-e2e.example.com/storage-not-ready
YAML

for class in block claimed encrypted; do
  cat > "$out/$class-storageclass.yaml" <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $class-disks}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
YAML
done
echo "$out"
