#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kubelet (for
# the real test node, tests/node/) from the
# pinned upstream Go modules in this folder, into a cache outside the repository keyed by the
# pinned versions and this script, and reuses that cache when it is already complete.
# Prints the folder holding the binaries on stdout (and nothing else).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KUBE_VERSION=$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")
ETCD_VERSION=$(awk '$1=="go.etcd.io/etcd/server/v3" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")
key=$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)
cache_root=${LSP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/local-static-provisioner}
out="$cache_root/control-plane/kube-$KUBE_VERSION-etcd-$ETCD_VERSION-$key"

# shellcheck source=tests/lib.sh
source "$here/../lib.sh"
reuse_or_lock "control plane" "$out" etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet

start=$(date +%s)
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
kv=k8s.io/component-base/version
kube_ldflags="-s -w -X $kv.gitVersion=$KUBE_VERSION -X $kv.gitMajor=1 -X $kv.gitMinor=$minor \
 -X $kv.gitTreeState=clean -X $kv.buildDate=$build_date \
 -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
etcd_ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=module-$ETCD_VERSION"

cd "$here"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
echo "control plane: building Kubernetes $KUBE_VERSION and etcd $ETCD_VERSION into $out (first time only)" >&2
lsp_stage "control plane" "etcd (1 of 6)" go build -trimpath -ldflags "$etcd_ldflags" -o "$out/bin/etcd" go.etcd.io/etcd/server/v3 >&2
n=1
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet; do
  n=$((n + 1))
  lsp_stage "control plane" "$cmd ($n of 6, $(( $(date +%s) - start )) s so far)" \
    go build -trimpath -ldflags "$kube_ldflags" -o "$out/bin/$cmd" "k8s.io/kubernetes/cmd/$cmd" >&2
done
build_done "control plane" "$out" "$start"
