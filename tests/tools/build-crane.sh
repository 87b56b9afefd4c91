#!/usr/bin/env bash
# Builds crane (pinned) from go-containerregistry's Go module into a cache outside the
# repository, once; prints the path of the crane binary. Used by scripts/check-image.sh to push
# the release image to a registry as docs/install.md shows. (Debian's skopeo would do too, but it
# brings iptables and container networking onto the machine, which the real test node's kubelet
# would then use.)
set -euo pipefail
CRANE_VERSION=v0.22.1
# shellcheck source=tests/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
go_install_cached crane "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"
