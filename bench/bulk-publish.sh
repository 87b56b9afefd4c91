#!/usr/bin/env bash
# Benchmark (not a test): N tmpfs volumes present at start (default 1000); time from agent start
# until all N PVs exist in the API, and the agent's peak memory. Needs root. Prints a JSON line
# and a readable line. Extra agent flags via AGENT_ARGS.
n=${1:-1000}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
for i in $(seq 1 "$n"); do mkdir -p "$work/disks/v$i"; mount -t tmpfs -o size=16m tmpfs "$work/disks/v$i"; done
start=$(now)
# shellcheck disable=SC2086
start_agent ${AGENT_ARGS:-}
while [[ $(k get pv -o name | wc -l) -lt $n ]]; do sleep 0.1; done
secs=$(elapsed "$start" "$(now)")
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$agent_pid/status")
echo "{\"figure\":\"bulk_publish\",\"volumes\":$n,\"seconds\":$secs,\"agent_vmhwm_kib\":$hwm}"
printf '%-14s %8s %10s %16s\n' figure volumes seconds agent_peak_MiB
printf '%-14s %8s %10s %16s\n' bulk_publish "$n" "$secs" "$(python3 -c "print(round($hwm/1024,1))")"
