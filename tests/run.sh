#!/usr/bin/env bash
# The whole test suite: format and lint checks, unit tests, host tests (real mounts and loop
# devices; skipped with a message unless root), integration tests against one real control
# plane built from the upstream Go modules, then end-to-end tests on a real node (kubelet,
# containerd, runc: tests/node/) running deploy/ and the Helm chart as users install them.
# Everything built is cached outside the repository and reused. Under CI (CI=true) nothing
# that needs root or the real node may be skipped: it fails instead.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Go and cargo, also under sudo (scripts/toolchain.sh), then the Debian tools the host tests
# and the real node use (quiet when nothing is missing).
# shellcheck source=scripts/toolchain.sh
source scripts/toolchain.sh
lsp_find_toolchains || exit 1
bash scripts/install-deps.sh
# Incremental artifacts only help a tree that is built again; a fresh clone under CI would just
# carry gigabytes of them (CI's disk has run out before).
if [[ ! ${CI:-} =~ ^(|0|false|FALSE|False)$ ]]; then export CARGO_INCREMENTAL=0; fi

# The build and the test disks need several GB; say what there is, so a full disk is plain.
echo "disk: $(df -h --output=avail . | tail -1 | tr -d ' ') free where the build goes"
echo "== format and lints"
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings

echo "== image checks (release binary the Dockerfile copies)"
bash scripts/check-image.sh

echo "== control plane"
bash tests/control-plane/build.sh > /dev/null
bash tests/tools/build-helm.sh > /dev/null
bash tests/tools/build-promtool.sh > /dev/null
bash tests/node/build.sh > /dev/null
cp_dir=$(mktemp -d -t lsp-test-control-plane.XXXXXX)
node_dir=$(mktemp -d -t lsp-test-node.XXXXXX)
# The node first: stop.sh puts the host back as it was (sysctls, kubelet's directories, mounts).
cleanup() {
  bash tests/node/stop.sh "$node_dir"; rm -rf "$node_dir"
  bash tests/control-plane/stop.sh "$cp_dir"; rm -rf "$cp_dir"
}
trap cleanup EXIT
bash tests/control-plane/start.sh "$cp_dir"

echo "== tests"
# The real-node tests run below, once the node is up.
LSP_CONTROL_PLANE_DIR=$cp_dir cargo test --all-targets --locked -- --skip real_node_

echo "== real node: kubelet, containerd and runc; deploy/ as shipped, workloads mounting volumes"
kubectl=$(bash tests/control-plane/build.sh)/kubectl
k() { "$kubectl" --kubeconfig "$cp_dir/admin.kubeconfig" "$@"; }
# The tests above registered fake Nodes; the DaemonSet and node-cleanup must land on the real one.
k delete nodes --all --wait=true > /dev/null
real_node=1
node_start=$SECONDS
bash tests/node/start.sh "$node_dir" "$cp_dir" || {
  rc=$?
  if (( rc == 3 )) && [[ ! ${CI:-} =~ ^(|0|false|FALSE|False)$ ]]; then
    echo "the real node cannot run here, and under CI that is a failure" >&2; exit 1
  fi
  (( rc == 3 )) || exit "$rc"
  echo "SKIPPED the real-node tests (see above why the node cannot run here; under CI this fails)" >&2
  real_node=0
}
if (( real_node )); then
  echo "real node up in $(( SECONDS - node_start )) s"
  LSP_CONTROL_PLANE_DIR=$cp_dir LSP_NODE_DIR=$node_dir cargo test --locked --test real_node -- --test-threads=1
fi

echo "== RBAC of the agent and of node-cleanup against what they really did (audit log)"
ns=local-static-provisioner
k get clusterrole local-static-provisioner -o json > "$cp_dir/agent-role.json"
k get role local-static-provisioner -n "$ns" -o json > "$cp_dir/agent-ns-role.json"
python3 tests/control-plane/check-rbac.py "$cp_dir/logs/audit.log" "$ns:local-static-provisioner" \
  "$cp_dir/agent-role.json" "$cp_dir/agent-ns-role.json"
k get clusterrole local-static-provisioner-node-cleanup -o json > "$cp_dir/node-cleanup-clusterrole.json"
k get role local-static-provisioner-node-cleanup -n "$ns" -o json > "$cp_dir/node-cleanup-role.json"
python3 tests/control-plane/check-rbac.py "$cp_dir/logs/audit.log" "$ns:local-static-provisioner-node-cleanup" \
  "$cp_dir/node-cleanup-clusterrole.json" "$cp_dir/node-cleanup-role.json"

if (( real_node )); then
  echo "== the Helm chart on the real node (replaces the deploy/ installation)"
  LSP_CONTROL_PLANE_DIR=$cp_dir LSP_NODE_DIR=$node_dir cargo test --locked --test real_node_helm
fi
