#!/usr/bin/env bash
# Benchmark (not a test): N tmpfs volumes present at start (default 1000); time from agent start
# until all N PVs exist in the API and the API requests it made, the agent's peak memory, then
# its CPU seconds and resident memory over IDLE_SECONDS (default 60) of idleness with the N
# volumes published. Needs root. Prints JSON lines and a table. Extra agent flags: AGENT_ARGS.
n=${1:-1000}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
for i in $(seq 1 "$n"); do mkdir -p "$work/disks/v$i"; mount -t tmpfs -o size=16m tmpfs "$work/disks/v$i"; done
start=$(now)
# shellcheck disable=SC2086
start_agent ${AGENT_ARGS:-}
while [[ $(k get pv -o name | wc -l) -lt $n ]]; do sleep 0.1; done
secs=$(elapsed "$start" "$(now)")
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$agent_pid/status")
# Idle means idle: wait until the PV controller has set every PV Available (its status updates
# are throttled to 20/s in kube-controller-manager and each one wakes the agent).
until [[ $(k get pv --no-headers | awk '$5 == "Available"' | wc -l) -ge $n ]]; do sleep 0.5; done
# And 11 s of quiet: the threads of the last passes (tokio's blocking pool, the host operation
# pool) end after 10 s idle, and the kernel rescales a process's user and system time when a
# thread exits, which would put part of the work done before the window inside it.
sleep 11
requests=$(grep -o '"auditID":"[^"]*"' "$work/cp/logs/audit.log" | sort -u | wc -l)
idle=${IDLE_SECONDS:-60}
ticks() { awk '{print $14 + $15}' "/proc/$agent_pid/stat"; }
t0=$(ticks); sleep "$idle"; t1=$(ticks)
cpu=$(python3 -c "print(round(($t1 - $t0) / $(getconf CLK_TCK), 3))")
rss=$(awk '/VmRSS/ {print $2}' "/proc/$agent_pid/status")
# Of which anonymous (heap, stacks): the rest is the mapped binary and libraries, shared and clean.
anon=$(awk '/RssAnon/ {print $2}' "/proc/$agent_pid/status")
echo "{\"figure\":\"bulk_publish\",\"volumes\":$n,\"seconds\":$secs,\"apiserver_requests_by_agent\":$requests,\"agent_vmhwm_kib\":$hwm}"
echo "{\"figure\":\"idle_cost\",\"volumes\":$n,\"seconds\":$idle,\"cpu_seconds\":$cpu,\"rss_kib\":$rss,\"rss_anon_kib\":$anon}"
printf '%-14s %8s %10s %14s %16s\n' figure volumes seconds api_requests agent_peak_MiB
printf '%-14s %8s %10s %14s %16s\n' bulk_publish "$n" "$secs" "$requests" "$(python3 -c "print(round($hwm/1024,1))")"
printf '%-14s %8s %10s %14s %16s\n' idle_cost "$n" "$idle" "cpu_s=$cpu" "rss=$(python3 -c "print(round($rss/1024,1))") anon=$(python3 -c "print(round($anon/1024,1))")"
