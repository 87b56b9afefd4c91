#!/usr/bin/env bash
# Benchmark (not a test): one pass's ledger lookups on a node with N used block volumes
# (default 1000), through the index and by a full scan. Needs no root and no control plane.
# Prints a JSON line and a table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo run --quiet --release --locked --example ledger_lookup -- "${1:-1000}"
