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

echo "== the agent's RBAC against what it really did (audit log)"
"$(bash tests/control-plane/build.sh)/kubectl" --kubeconfig "$cp_dir/admin.kubeconfig" \
  get clusterrole local-static-provisioner -o json > "$cp_dir/clusterrole.json"
python3 tests/control-plane/check-rbac.py "$cp_dir/logs/audit.log" "$cp_dir/clusterrole.json"
