#!/usr/bin/env bash
# Builds promtool (pinned) from the Prometheus Go module into a cache outside the repository,
# once; prints the path of the promtool binary. Used by tests/cluster/chart.rs to check and
# unit-test the chart's PrometheusRule and the PromQL of its Grafana dashboard. (Debian's prometheus
# package is older and installs a server that starts as a service; only the checker is needed.)
set -euo pipefail
# Prometheus v3.x is published as Go module versions v0.3XX.Y.
PROMETHEUS_MODULE_VERSION=v0.316.0
# shellcheck source=tests/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
go_install_cached promtool "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_MODULE_VERSION"
