#!/usr/bin/env bash
# The whole test suite: format and lint checks, unit tests, host tests (real mounts and loop
# devices; skipped with a message unless root) and integration tests against one real
# control plane built from the upstream Go modules (built once, then reused from the cache).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== format and lints"
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings

echo "== image checks (release binary the Dockerfile copies)"
bash scripts/check-image.sh

echo "== control plane"
bash tests/control-plane/build.sh > /dev/null
bash tests/tools/build-helm.sh > /dev/null
cp_dir=$(mktemp -d -t lsp-test-control-plane.XXXXXX)
cleanup() { bash tests/control-plane/stop.sh "$cp_dir"; rm -rf "$cp_dir"; }
trap cleanup EXIT
bash tests/control-plane/start.sh "$cp_dir"

echo "== tests"
LSP_CONTROL_PLANE_DIR=$cp_dir cargo test --all-targets --locked

echo "== RBAC of the agent and of node-cleanup against what they really did (audit log)"
kubectl=$(bash tests/control-plane/build.sh)/kubectl
k() { "$kubectl" --kubeconfig "$cp_dir/admin.kubeconfig" "$@"; }
ns=local-static-provisioner
k get clusterrole local-static-provisioner -o json > "$cp_dir/agent-role.json"
python3 tests/control-plane/check-rbac.py "$cp_dir/logs/audit.log" "$ns:local-static-provisioner" \
  "$cp_dir/agent-role.json"
k get clusterrole local-static-provisioner-node-cleanup -o json > "$cp_dir/node-cleanup-clusterrole.json"
k get role local-static-provisioner-node-cleanup -n "$ns" -o json > "$cp_dir/node-cleanup-role.json"
python3 tests/control-plane/check-rbac.py "$cp_dir/logs/audit.log" "$ns:local-static-provisioner-node-cleanup" \
  "$cp_dir/node-cleanup-clusterrole.json" "$cp_dir/node-cleanup-role.json"
