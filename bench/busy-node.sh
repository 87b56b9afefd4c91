#!/usr/bin/env bash
# Benchmark (not a test): a busy node. One agent with N tmpfs volumes (default 100), ours and
# upstream's v2.9.0 side by side (IMPL=ours|upstream|both, default both), idle for IDLE_SECONDS
# (default 60) after 11 s of quiet while a tmpfs OUTSIDE the discovery directory is mounted and
# unmounted twice a second in the agent's mount namespace (kubelet does so for every pod):
# CPU-s and RSS of the agent over the window, the API server's CPU-s, the agent's requests and
# the mount-table changes seen. Ours should cost what it costs on a quiet node (a change that
# touches nothing a pass read wakes no pass: core::mounts::mount_interest). It is bench/fleet.sh with
# one agent, no PV churn and NOISE=1. Needs root.
n=${1:-100}
CHURN=0 NOISE=1 FIGURE=${FIGURE:-busy_node} exec bash "$(dirname "${BASH_SOURCE[0]}")/fleet.sh" 1 "$n"
