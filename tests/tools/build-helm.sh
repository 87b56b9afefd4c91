#!/usr/bin/env bash
# Builds Helm (pinned) from its Go module into a cache outside the repository, once; prints
# the path of the helm binary. Used by the chart tests to render deploy/helm.
set -euo pipefail
HELM_VERSION=v3.22.0
cache_root=${LSP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/local-static-provisioner}
out="$cache_root/helm-$HELM_VERSION"
if [[ ! -x "$out/helm" ]]; then
  mkdir -p "$out"
  echo "helm: building $HELM_VERSION into $out (first time only)" >&2
  CGO_ENABLED=0 GOBIN="$out" GOFLAGS=-mod=mod go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
fi
echo "$out/helm"
