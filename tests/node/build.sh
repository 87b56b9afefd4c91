#!/usr/bin/env bash
# Builds the container runtime of the real test node from the pinned upstream Go modules in
# this folder: containerd v2 with its runc shim and ctr, runc (cgo, with seccomp, which
# containerd 2 requires) and the CNI loopback plugin. Into a cache outside the repository keyed
# by the pinned versions and this script, reused when complete. kubelet is built with the
# control plane (tests/control-plane/build.sh), from the same module set as the API server.
# Prints the folder holding the binaries on stdout (and nothing else).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version() { awk -v m="$1" '$1==m && $2 ~ /^v/ {print $2; exit}' "$here/go.mod"; }
CONTAINERD_VERSION=$(version github.com/containerd/containerd/v2)
RUNC_VERSION=$(version github.com/opencontainers/runc)
key=$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)
cache_root=${LSP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/local-static-provisioner}
out="$cache_root/node-runtime/containerd-$CONTAINERD_VERSION-runc-$RUNC_VERSION-$key"

# shellcheck source=tests/lib.sh
source "$here/../lib.sh"
reuse_or_lock "node runtime" "$out" containerd containerd-shim-runc-v2 ctr runc loopback
pkg-config --exists libseccomp || {
  echo "node runtime: libseccomp headers are missing (scripts/install-deps.sh installs libseccomp-dev)" >&2; exit 1; }

start=$(date +%s)
cd "$here"
export GOFLAGS=-mod=mod
echo "node runtime: building containerd $CONTAINERD_VERSION and runc $RUNC_VERSION into $out (first time only)" >&2
cv=github.com/containerd/containerd/v2/version
CGO_ENABLED=0 lsp_stage "node runtime" "containerd (1 of 3)" go build -trimpath -tags no_btrfs,no_devmapper,no_zfs,no_aufs \
  -ldflags "-s -w -X $cv.Version=$CONTAINERD_VERSION -X $cv.Revision=module" \
  -o "$out/bin/" github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr >&2
# runc needs cgo for nsexec and libseccomp; without seccomp containerd 2 refuses every container
# ("seccomp: config provided but seccomp not supported").
CGO_ENABLED=1 lsp_stage "node runtime" "runc (2 of 3)" go build -trimpath -tags seccomp -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" \
  -o "$out/bin/runc" github.com/opencontainers/runc >&2
CGO_ENABLED=0 lsp_stage "node runtime" "the CNI loopback plugin (3 of 3)" go build -trimpath -ldflags "-s -w" -o "$out/bin/loopback" \
  github.com/containernetworking/plugins/plugins/main/loopback >&2
build_done "node runtime" "$out" "$start"
