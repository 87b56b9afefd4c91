#!/usr/bin/env bash
# Starts a real Kubernetes node on this machine, registered with a control plane that
# tests/control-plane/start.sh started: containerd v2 and runc (tests/node/build.sh), kubelet
# (built with the control plane) and the images of tests/node/images/ imported without a
# registry. Pods run for real: kubelet mounts local PVs into them.
#
# Usage: start.sh DIR CONTROL_PLANE_DIR
#   DIR is created and holds the runtime's state, kubelet's config and credentials, logs/, the
#   PIDs and the host state recorded before the node changed it; DIR/env is a shell file with
#   NODE_NAME, the runtime socket and the image names. Stop with stop.sh DIR, which restores the
#   host (also after a failed start).
# Exit code 3, with the reason on stderr, when this machine cannot run a node at all (not root,
# no cgroups, no overlayfs, or a kubelet or containerd of the host's own is there).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=${1:?usage: start.sh DIR CONTROL_PLANE_DIR}
cp_dir=${2:?usage: start.sh DIR CONTROL_PLANE_DIR}
cp_dir=$(cd "$cp_dir" && pwd)
NODE_NAME=${NODE_NAME:-lsp-real-node}
KUBELET_ROOT=/var/lib/kubelet
# The discovery directories of the shipped ConfigMap and of the overlay's block and
# device-claiming classes, and of its encrypting class.
DISCOVERY_DIRS=(/mnt/fast-disks /mnt/block-disks /mnt/claimed-disks /mnt/encrypted-disks)
PAUSE_IMAGE=registry.local/lsp-test/pause:1
SHELL_IMAGE=registry.local/lsp-test/shell:1
AGENT_IMAGE=docker.io/library/local-static-provisioner:e2e

cannot() { echo "real node: cannot run on this machine: $*" >&2; exit 3; }
(( EUID == 0 )) || cannot "needs root (kubelet, containerd and runc manage cgroups, mounts and namespaces)"
[[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers ]] || cannot "no cgroup memory controller under /sys/fs/cgroup"
grep -qw overlay /proc/filesystems || modprobe overlay 2> /dev/null || cannot "no overlayfs (containerd's snapshotter)"
# One kubelet per host: the /kubepods cgroups and kubelet's root directory are shared.
[[ ! -e $KUBELET_ROOT || -f $KUBELET_ROOT/.lsp-test-node ]] \
  || cannot "$KUBELET_ROOT exists and is not ours: this host runs a kubelet of its own"

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
mkdir -p "$dir/logs" "$dir/pki" "$dir/cni" "$dir/images"
echo "$cp_dir" > "$dir/control-plane-dir"
: > "$dir/pids"
# shellcheck disable=SC1091
source "$cp_dir/env"
bin=$(bash "$here/build.sh")
echo "$bin" > "$dir/runtime-bin"
kubectl() { "$CONTROL_PLANE_BIN/kubectl" --kubeconfig "$cp_dir/admin.kubeconfig" "$@"; }

# shellcheck source=tests/lib.sh
source "$here/../lib.sh"
fail() { fail_and_stop "real node" "$here/stop.sh" "$@"; }

# ---- a node left behind by a run that was killed: restore the host it changed first ----
active=/run/lsp-test-node.active
if [[ -f $active ]]; then
  old=$(cat "$active")
  if [[ -d $old && $old != "$dir" ]]; then
    echo "real node: restoring the host after an earlier run ($old)" >&2
    bash "$here/stop.sh" "$old" >&2 || true
  fi
fi

# ---- record what kubelet and the runtime change on the host (stop.sh puts it back) ----
sysctls=(kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom kernel.keys.root_maxkeys
         kernel.keys.root_maxbytes)
{
  for s in "${sysctls[@]}"; do echo "sysctl $s $(sysctl -n "$s")"; done
  for d in "${DISCOVERY_DIRS[@]}" /var/lib/local-static-provisioner "$KUBELET_ROOT" /var/log/containers /var/log/pods /run/containerd /var/lib/cni /run/netns; do
    [[ -e $d ]] && echo "existed $d" || echo "absent $d"
  done
  compgen -G '/sys/fs/cgroup/*/kubepods' > /dev/null && echo "existed kubepods-cgroups" || echo "absent kubepods-cgroups"
  if command -v iptables > /dev/null; then
    for c in KUBE-FIREWALL KUBE-KUBELET-CANARY; do
      iptables -w -S "$c" > /dev/null 2>&1 && echo "chain $c existed" || echo "chain $c absent"
    done
  fi
} > "$dir/host-state"
echo "$dir" > "$active"
mkdir -p "$KUBELET_ROOT"
touch "$KUBELET_ROOT/.lsp-test-node"

# ---- kubelet's credentials: a client certificate of the node group, signed by the test CA ----
pki=$dir/pki
ossl() { openssl "$@" > /dev/null 2>&1 || fail "openssl $1 failed"; }
ossl req -newkey rsa:2048 -nodes -keyout "$pki/kubelet.key" -out "$pki/kubelet.csr" \
  -subj "/O=system:nodes/CN=system:node:$NODE_NAME"
printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' \
  > "$pki/kubelet.ext"
ossl x509 -req -in "$pki/kubelet.csr" -CA "$cp_dir/pki/ca.crt" -CAkey "$cp_dir/pki/ca.key" -CAcreateserial \
  -out "$pki/kubelet.crt" -days 365 -extfile "$pki/kubelet.ext"
cat > "$dir/kubelet.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "$API_URL", certificate-authority: "$cp_dir/pki/ca.crt"}
users:
- name: node
  user: {client-certificate: "$pki/kubelet.crt", client-key: "$pki/kubelet.key"}
contexts:
- name: local
  context: {cluster: local, user: node}
current-context: local
KC
# The test control plane runs RBAC without the Node authorizer: the node group gets the node role.
kubectl create clusterrolebinding lsp-test-system-nodes --clusterrole system:node --group system:nodes \
  --dry-run=client -o yaml | kubectl apply -f - > /dev/null

# ---- containerd: its own root, state, socket and runc root; nothing of the host's ----
sock=$dir/containerd.sock
cat > "$dir/containerd.toml" <<TOML
version = 3
root = "$dir/containerd/root"
state = "$dir/containerd/state"
imports = []
disabled_plugins = ["io.containerd.nri.v1.nri"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "$dir/containerd/opt"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "$PAUSE_IMAGE"
[plugins.'io.containerd.cri.v1.runtime']
  # root here lacks CAP_SYS_RESOURCE: runc must not lower a container's oom_score_adj below ours.
  restrict_oom_score_adj = true
  # Network namespaces under our state directory, not the host's /run/netns.
  netns_mounts_under_state_dir = true
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = "$bin/runc"
  Root = "$dir/runc"
  SystemdCgroup = false
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["$bin"]
  conf_dir = "$dir/cni"
TOML
# Only the loopback plugin: the runtime reports its network ready; pods that need the API use
# the host's network.
echo '{"cniVersion": "1.0.0", "name": "loopback-only", "plugins": [{"type": "loopback"}]}' \
  > "$dir/cni/10-loopback.conflist"
# shellcheck source=tests/node/boot.sh
source "$here/boot.sh"
start_containerd

# ---- images, assembled by our own script and imported (no registry) ----
PAUSE_IMAGE=$PAUSE_IMAGE SHELL_IMAGE=$SHELL_IMAGE AGENT_IMAGE=$AGENT_IMAGE bash "$here/images/build.sh" "$dir/images" 2> "$dir/logs/images.log" \
  || fail "building the images failed"
for tar in pause shell agent; do
  ctr images import --no-unpack=false "$dir/images/$tar.tar" > /dev/null 2>> "$dir/logs/images.log" \
    || fail "importing $tar.tar failed"
done

# ---- discovery directories: shared mounts, so that a disk mounted on the host later reaches the
# agent's container (mountPropagation: HostToContainer; / is a private mount here) ----
for d in "${DISCOVERY_DIRS[@]}"; do
  mkdir -p "$d"
  if ! awk -v d="$d" '$5 == d {found=1} END {exit !found}' /proc/self/mountinfo; then
    mount --bind "$d" "$d"
    echo "bound $d" >> "$dir/host-state"
  fi
  mount --make-rshared "$d"
done

# ---- kubelet ----
kubelet_port=$(free_port); healthz_port=$(free_port)
cat > "$dir/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz_port
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: "$cp_dir/pki/ca.crt"}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://$sock
# This machine kind: cgroup v1, swap allowed, no systemd.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podLogsDir: $dir/pod-logs
serializeImagePulls: false
# The images were imported, never pulled: nothing may garbage-collect them, and a nearly full
# test disk must not evict pods or taint the node.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
syncFrequency: 10s
fileCheckFrequency: 5s
volumeStatsAggPeriod: 0s
YAML
boot_fence
start_kubelet

cat > "$dir/env" <<ENV
export NODE_NAME=$NODE_NAME
export NODE_DIR=$dir
export NODE_BIN=$bin
export CONTAINERD_SOCK=$sock
export KUBELET_ROOT=$KUBELET_ROOT
export DISCOVERY_DIRS="${DISCOVERY_DIRS[*]}"
export POD_LOGS_DIR=$dir/pod-logs
export PAUSE_IMAGE=$PAUSE_IMAGE
export SHELL_IMAGE=$SHELL_IMAGE
export AGENT_IMAGE=$AGENT_IMAGE
ENV
echo "real node: $NODE_NAME Ready (kubelet $kubelet_port, runtime $sock, logs $dir/logs)" >&2
