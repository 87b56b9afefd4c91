#!/usr/bin/env bash
# Builds Helm (pinned) from its Go module into a cache outside the repository, once; prints
# the path of the helm binary. Used by the chart tests to render deploy/helm.
set -euo pipefail
HELM_VERSION=v3.22.0
# shellcheck source=tests/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
go_install_cached helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
  "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
