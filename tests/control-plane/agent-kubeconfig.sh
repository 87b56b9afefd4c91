#!/usr/bin/env bash
# Applies a component's Namespace, ServiceAccount and RBAC from deploy/ to the control plane
# started in DIR, and writes OUT: a kubeconfig holding a token of that ServiceAccount, so the
# component under test runs with exactly the permissions production gives it, never as admin.
# COMPONENT is `agent` (deploy/base, the default) or `node-cleanup` (deploy/node-cleanup).
# Usage: agent-kubeconfig.sh DIR OUT [COMPONENT]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=${1:?usage: agent-kubeconfig.sh DIR OUT [COMPONENT]}
out=${2:?usage: agent-kubeconfig.sh DIR OUT [COMPONENT]}
component=${3:-agent}
# shellcheck disable=SC1091
source "$dir/env"
k() { "$CONTROL_PLANE_BIN/kubectl" --kubeconfig "$dir/admin.kubeconfig" "$@"; }
# Tests running side by side apply the same objects: a create that loses the race to another
# (AlreadyExists) is applied again, as an update.
apply() { k apply -f "$1" > /dev/null 2>&1 || k apply -f "$1" > /dev/null; }
apply "$repo/deploy/base/namespace.yaml"
case $component in
  agent)
    for f in serviceaccount rbac crd; do apply "$repo/deploy/base/$f.yaml"; done
    sa=local-static-provisioner ;;
  node-cleanup)
    for f in serviceaccount rbac; do apply "$repo/deploy/node-cleanup/$f.yaml"; done
    sa=local-static-provisioner-node-cleanup ;;
  *) echo "unknown component $component (agent or node-cleanup)" >&2; exit 2 ;;
esac
token=$(k create token "$sa" -n local-static-provisioner --duration 24h)
umask 077
cat > "$out" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: $API_URL, certificate-authority-data: $(base64 -w0 "$dir/pki/ca.crt")}}]
users: [{name: $sa, user: {token: $token}}]
contexts: [{name: local, context: {cluster: local, user: $sa}}]
current-context: local
KC
