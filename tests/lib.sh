# Helpers the start scripts of the test control plane and of the real test node share. Source it
# after setting `dir` (the instance's directory, holding logs/ and pids).

# A free TCP port on loopback.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# launch NAME ARGS...: runs in its own session, output to logs/NAME.log, PID recorded in pids.
launch() {
  local name=$1; shift
  setsid "$@" > "$dir/logs/$name.log" 2>&1 < /dev/null &
  echo "$! $name" >> "$dir/pids"
}

# fail_and_stop WHO STOP_SCRIPT MESSAGE...: says what failed with the last lines of every log,
# stops what was started (STOP_SCRIPT DIR), and exits 1.
fail_and_stop() {
  local who=$1 stop=$2 f; shift 2
  echo "$who: $*" >&2
  for f in "$dir"/logs/*.log; do
    [[ -f "$f" ]] || continue
    echo "----- last lines of $f -----" >&2
    tail -n 40 "$f" >&2
  done
  bash "$stop" "$dir" >&2 || true
  exit 1
}
