#!/usr/bin/env bash
# Builds promtool (pinned) from the Prometheus Go module into a cache outside the repository,
# once; prints the path of the promtool binary. Used by tests/chart.rs to check and unit-test
# the chart's PrometheusRule and the PromQL of its Grafana dashboard. (Debian's prometheus
# package is older and installs a server that starts as a service; only the checker is needed.)
set -euo pipefail
# Prometheus v3.x is published as Go module versions v0.3XX.Y.
PROMETHEUS_MODULE_VERSION=v0.316.0
cache_root=${LSP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/local-static-provisioner}
out="$cache_root/promtool-$PROMETHEUS_MODULE_VERSION"
if [[ ! -x "$out/promtool" ]]; then
  echo "promtool: building Prometheus module $PROMETHEUS_MODULE_VERSION into $out (first time only)" >&2
  tmp="$out.tmp.$$"
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp"
  CGO_ENABLED=0 GOBIN="$tmp" GOFLAGS=-mod=mod go install -trimpath -ldflags "-s -w" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_MODULE_VERSION" >&2
  # Published whole or not at all: a build cut short leaves no half-made cache behind.
  mkdir -p "$out"
  mv "$tmp/promtool" "$out/promtool"
fi
echo "$out/promtool"
