//go:build tools

// Package tools pins the main packages that build.sh compiles for the real test node (the
// container runtime kubelet talks to), so that `go mod tidy` keeps every module they need in
// go.sum. kubelet itself is built with the control plane, from its pinned module set.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/opencontainers/runc"
)
