#!/usr/bin/env bash
# Builds upstream's provisioner (kubernetes-sigs/sig-storage-local-static-provisioner, tag
# v2.9.0, cmd/local-volume-provisioner) for the side-by-side benchmarks, into a cache outside
# the repository keyed by the pinned commit and this script, and reuses that cache when it is
# already complete. Prints the folder holding the binary on stdout (and nothing else).
#
# The Go module proxy does not serve this module (it answers 403 for every version of
# sigs.k8s.io/sig-storage-local-static-provisioner), so the source comes from a git copy of
# the upstream repository: UPSTREAM_GIT (a git directory, bare or not; default the mirror at
# /work/.mirror/kubernetes-sigs+sig-storage-local-static-provisioner/repo). Only the pinned
# commit of the tag is accepted, whatever the copy's tag says. The tag's tree commits its
# vendor/ folder, and upstream's Makefile builds with `-mod vendor`: so does this, so the build
# needs no network at all and is the binary upstream ships (less the image around it).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
UPSTREAM_TAG=v2.9.0
UPSTREAM_COMMIT=30b98c3c3734a79cebd95ad8ac80620c0ea4aa73
src_git=${UPSTREAM_GIT:-/work/.mirror/kubernetes-sigs+sig-storage-local-static-provisioner/repo}
key=$(cat "$here/build.sh" | sha256sum | cut -c1-12)
cache_root=${LSP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/local-static-provisioner}
out="$cache_root/upstream-$UPSTREAM_TAG/$key"

# shellcheck source=tests/lib.sh
source "$here/../../tests/lib.sh"
reuse_or_lock "upstream $UPSTREAM_TAG" "$out" local-volume-provisioner

start=$(date +%s)
[[ -d "$src_git" ]] || { echo "upstream: no git copy at $src_git (set UPSTREAM_GIT)" >&2; exit 1; }
got=$(git -C "$src_git" rev-parse --verify -q "$UPSTREAM_COMMIT^{commit}") \
  || { echo "upstream: $src_git lacks commit $UPSTREAM_COMMIT ($UPSTREAM_TAG)" >&2; exit 1; }
[[ "$got" == "$UPSTREAM_COMMIT" ]] || { echo "upstream: unexpected commit $got" >&2; exit 1; }
tmp=$(mktemp -d -t lsp-upstream-src.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
git -C "$src_git" archive "$UPSTREAM_COMMIT" | tar -x -C "$tmp"
echo "upstream: building $UPSTREAM_TAG ($UPSTREAM_COMMIT) into $out (first time only)" >&2
(cd "$tmp" && CGO_ENABLED=0 GOFLAGS=-mod=vendor go build -trimpath -ldflags "-s -w" \
  -o "$out/bin/local-volume-provisioner" ./cmd/local-volume-provisioner) >&2
build_done "upstream $UPSTREAM_TAG" "$out" "$start"
