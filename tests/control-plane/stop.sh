#!/usr/bin/env bash
# Stops the processes start.sh recorded in DIR/pids (and nothing else), newest first.
set -uo pipefail
dir=${1:?usage: stop.sh DIR}
[[ -f "$dir/pids" ]] || exit 0
pids=$(tac "$dir/pids" | awk '{print $1}')
for pid in $pids; do kill -TERM "$pid" 2>/dev/null; done
for _ in $(seq 1 50); do
  alive=0
  for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive=1; done
  (( alive )) || break
  sleep 0.1
done
for pid in $pids; do kill -KILL "$pid" 2>/dev/null; done
: > "$dir/pids"
