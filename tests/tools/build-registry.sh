#!/usr/bin/env bash
# Builds the CNCF distribution registry (pinned; the registry Docker Hub and most private
# registries run) from its Go module into a cache outside the repository, once; prints the path
# of the registry binary. scripts/check-image.sh runs it on loopback to push the release image
# to. (Debian's docker-registry package installs a service that starts on port 5000.)
set -euo pipefail
REGISTRY_VERSION=v3.0.0
# shellcheck source=tests/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
go_install_cached registry "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"
