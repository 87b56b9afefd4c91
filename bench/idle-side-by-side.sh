#!/usr/bin/env bash
# Benchmark (not a test): one agent with N tmpfs volumes (default 100), ours and upstream's
# v2.9.0 side by side (IMPL=ours|upstream|both, default both), each on a fresh control plane:
# CPU-s and RSS over IDLE_SECONDS (default 60) of idleness after 11 s of quiet, with the API
# server's CPU-s and the agent's requests. It is bench/fleet.sh with one agent and no churn.
# Needs root.
n=${1:-100}
CHURN=0 FIGURE=${FIGURE:-idle_side_by_side} exec bash "$(dirname "${BASH_SOURCE[0]}")/fleet.sh" 1 "$n"
