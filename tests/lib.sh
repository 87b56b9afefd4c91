# Helpers the build and start scripts of the test control plane, of the real test node and of
# the test tools (tests/tools) share.
# The start helpers use `dir` (the instance's directory, holding logs/ and pids).

# A free TCP port on loopback.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# started_at PID: the process's start time (clock ticks since boot, /proc/PID/stat field 22),
# which tells it from a later process that got its PID once it is gone.
started_at() {
  local stat
  stat=$(cat "/proc/$1/stat" 2> /dev/null) || return 0
  awk '{print $20}' <<< "${stat##*) }"
}

# launch NAME ARGS...: runs in its own session, output to logs/NAME.log, PID recorded in pids
# with its start time (stop scripts signal only the process they started, never a PID reused).
launch() {
  local name=$1; shift
  setsid "$@" > "$dir/logs/$name.log" 2>&1 < /dev/null &
  echo "$! $name $(started_at $!)" >> "$dir/pids"
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

# wait_for WHAT SECONDS COMMAND...: runs COMMAND until it succeeds; fails (fail_and_stop through
# the caller's `fail`) after SECONDS, or as soon as a process recorded in pids has exited.
wait_for() {
  local what=$1 secs=$2 pid_name; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" > /dev/null 2>&1; do
    (( SECONDS < deadline )) || fail "$what after $secs s"
    for pid_name in $(awk '{print $1":"$2}' "$dir/pids"); do
      kill -0 "${pid_name%%:*}" 2> /dev/null || fail "${pid_name#*:} exited"
    done
    sleep 0.3
  done
}

# reuse_or_lock WHO OUT BINARY...: the cache of a build. When OUT/bin holds every BINARY of a
# completed build, prints OUT/bin and exits (the build script is done). Otherwise takes OUT's lock
# (a concurrent build of the same key is waited for, and reused if it completed) and returns: the
# caller builds into OUT/bin, then calls build_done.
reuse_or_lock() {
  local who=$1 out=$2 b; shift 2
  local bins=("$@")
  complete() {
    for b in "${bins[@]}"; do [[ -x "$out/bin/$b" ]] || return 1; done
    [[ -f "$out/.complete" ]]
  }
  if complete; then
    echo "$who: reusing $out" >&2
    echo "$out/bin"
    exit 0
  fi
  # shellcheck source=scripts/toolchain.sh
  source "$(dirname "${BASH_SOURCE[0]}")/../scripts/toolchain.sh"
  lsp_find_toolchains go || exit 1
  mkdir -p "$out/bin"
  exec 9> "$out/.lock"
  lsp_lock "$who" 9 "$out/.lock" "$out"
  if complete; then echo "$who: reusing $out, which the other build completed" >&2; echo "$out/bin"; exit 0; fi
}

# build_done WHO OUT START: marks OUT's build complete, says how long it took since START
# ($(date +%s) before building), and prints OUT/bin.
build_done() {
  touch "$2/.complete"
  echo "$1: built in $(( $(date +%s) - $3 )) s" >&2
  echo "$2/bin"
}

# go_install_cached NAME PACKAGE@VERSION [LDFLAGS]: a test tool built from its pinned Go module
# once, into CACHE/NAME-VERSION/NAME (CACHE: $LSP_CACHE_DIR, default
# ~/.cache/local-static-provisioner), published whole or not at all (a build cut short leaves no
# half-made cache behind); prints the binary's path.
go_install_cached() {
  local name=$1 pkg=$2 ldflags=${3:-"-s -w"}
  local cache_root=${LSP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/local-static-provisioner}
  local out="$cache_root/$name-${pkg##*@}"
  if [[ ! -x "$out/$name" ]]; then
    echo "$name: building $pkg into $out (first time only)" >&2
    # Go where the invoking user has it, also when this script runs under sudo by itself.
    # shellcheck source=scripts/toolchain.sh
    source "$(dirname "${BASH_SOURCE[0]}")/../scripts/toolchain.sh"
    lsp_find_toolchains go || return 1
    local tmp="$out.tmp.$$"
    mkdir -p "$tmp"
    CGO_ENABLED=0 GOBIN="$tmp" GOFLAGS=-mod=mod go install -trimpath -ldflags "$ldflags" "$pkg" >&2 \
      || { rm -rf "$tmp"; return 1; }
    mkdir -p "$out"
    mv "$tmp/$name" "$out/$name"
    rm -rf "$tmp"
  fi
  echo "$out/$name"
}
