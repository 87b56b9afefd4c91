#!/usr/bin/env bash
# Fetches the Prometheus Operator's Go module (pinned) into Go's module cache, once, and prints
# the directory of its CRDs (ServiceMonitor, PrometheusRule, ...). tests/cluster/chart.rs installs
# the two the chart uses into the test control plane, so that the server-side dry run validates
# the chart's ServiceMonitors and PrometheusRule against their real schemas.
set -euo pipefail
PROMETHEUS_OPERATOR_VERSION=v0.85.0
dir=$(GOFLAGS=-mod=mod go mod download -json "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" |
  python3 -c 'import json, sys; d = json.load(sys.stdin); sys.exit(d["Error"]) if d.get("Error") else print(d["Dir"])')
crds="$dir/example/prometheus-operator-crd"
[[ -f "$crds/monitoring.coreos.com_prometheusrules.yaml" ]] || { echo "no CRDs in $crds" >&2; exit 1; }
echo "$crds"
