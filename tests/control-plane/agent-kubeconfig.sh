#!/usr/bin/env bash
# Applies the agent's Namespace, ServiceAccount and RBAC from deploy/base to the control plane
# started in DIR, and writes OUT: a kubeconfig holding a token of that ServiceAccount, so the
# agent under test runs with exactly the permissions production gives it, never as admin.
# Usage: agent-kubeconfig.sh DIR OUT
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=${1:?usage: agent-kubeconfig.sh DIR OUT}
out=${2:?usage: agent-kubeconfig.sh DIR OUT}
# shellcheck disable=SC1091
source "$dir/env"
k() { "$CONTROL_PLANE_BIN/kubectl" --kubeconfig "$dir/admin.kubeconfig" "$@"; }
for f in namespace serviceaccount rbac; do k apply -f "$repo/deploy/base/$f.yaml" > /dev/null; done
token=$(k create token local-static-provisioner -n local-static-provisioner --duration 24h)
umask 077
cat > "$out" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: $API_URL, certificate-authority-data: $(base64 -w0 "$dir/pki/ca.crt")}}]
users: [{name: agent, user: {token: $token}}]
contexts: [{name: local, context: {cluster: local, user: agent}}]
current-context: local
KC
