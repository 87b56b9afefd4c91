#!/usr/bin/env bash
# Helm post-renderer for the real test node: what tests/node/overlay.sh changes for deploy/,
# applied to the chart's output. The agent's DaemonSet uses the host's network (no CNI network,
# no kube-proxy on the test node) with KUBERNETES_SERVICE_HOST/PORT at the API server on
# loopback. Everything else is the chart as rendered.
# Usage (by helm): --post-renderer tests/node/helm-post-render.sh --post-renderer-args API_HOST
#   --post-renderer-args API_PORT; KUBECTL names the kubectl to run kustomize with.
set -euo pipefail
api_host=${1:?API host} api_port=${2:?API port}
work=$(mktemp -d -t lsp-helm-post-render.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat > "$work/all.yaml"
cat > "$work/kustomization.yaml" <<YAML
resources: [all.yaml]
patches:
  - target: {kind: DaemonSet}
    patch: |
      - {op: add, path: /spec/template/spec/hostNetwork, value: true}
      - {op: add, path: /spec/template/spec/dnsPolicy, value: ClusterFirstWithHostNet}
      - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_HOST, value: "$api_host"}}
      - {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: KUBERNETES_SERVICE_PORT, value: "$api_port"}}
YAML
"${KUBECTL:?KUBECTL: the kubectl to run kustomize with}" kustomize "$work"
