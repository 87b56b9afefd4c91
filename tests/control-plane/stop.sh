#!/usr/bin/env bash
# Stops the processes start.sh recorded in DIR/pids (and nothing else), newest first. A PID is
# signalled only while it is still the process start.sh started (its start time, recorded
# beside it): a process that exited may have left its PID to another test's process.
set -uo pipefail
dir=${1:?usage: stop.sh DIR}
[[ -f "$dir/pids" ]] || exit 0
# ours PID START: whether PID is still the process that started at START (no START recorded:
# an older pids file, taken as ours while the PID lives).
ours() {
  local stat
  stat=$(cat "/proc/$1/stat" 2> /dev/null) || return 1
  [[ -z $2 ]] || [[ $(awk '{print $20}' <<< "${stat##*) }") == "$2" ]]
}
mapfile -t entries < <(tac "$dir/pids" | awk '{print $1" "$3}')
signal() {
  local entry pid start
  for entry in "${entries[@]}"; do
    read -r pid start <<< "$entry"
    ours "$pid" "${start:-}" && kill "-$1" "$pid" 2> /dev/null
  done
  return 0
}
signal TERM
for _ in $(seq 1 50); do
  alive=0
  for entry in "${entries[@]}"; do
    read -r pid start <<< "$entry"
    ours "$pid" "${start:-}" && alive=1
  done
  (( alive )) || break
  sleep 0.1
done
signal KILL
: > "$dir/pids"
