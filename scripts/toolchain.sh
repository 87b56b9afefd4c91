# Finds the Go and Rust toolchains for the project's scripts (sourced, not run). Under sudo,
# secure_path drops /usr/local/go/bin and ~/.cargo/bin, so `sudo bash scripts/demo.sh` would
# not find the toolchains the invoking user has. Looked for, in order: PATH; then the
# toolchains of the user who ran sudo (SUDO_USER: their ~/.cargo/bin, ~/go/bin's sibling SDKs
# ~/sdk/go*/bin, ~/.local/go/bin, and what their login shell finds); then the usual system
# places (/usr/local/go/bin, /usr/lib/go-1.*/bin, /usr/lib/go/bin, /snap/bin). What is found is
# put on PATH; when cargo is the invoking user's rustup proxy, RUSTUP_HOME points at their
# toolchains (only read). Caches stay the running user's own: under sudo, root's
# ~/.cargo/registry, ~/.cache/go-build and ~/.cache/local-static-provisioner, so nothing
# root-owned is written into the invoking user's home.
#
# lsp_find_toolchains [go] [cargo]: finds those named (both by default); returns 1 after printing
# what to do when one is missing.
# LSP_TOOLCHAIN_HOME: a home to search instead of SUDO_USER's (tests).

# The invoking user's home under sudo, or LSP_TOOLCHAIN_HOME.
lsp_user_home() {
  if [[ -n ${LSP_TOOLCHAIN_HOME:-} ]]; then
    echo "$LSP_TOOLCHAIN_HOME"
  elif [[ -n ${SUDO_USER:-} && $SUDO_USER != root ]]; then
    getent passwd "$SUDO_USER" | cut -d: -f6
  fi
}

# lsp_go_ok GO: whether GO runs and is at least Go 1.26.
lsp_go_ok() {
  local v
  v=$("$1" env GOVERSION 2> /dev/null) || return 1
  v=${v#go}
  local major=${v%%.*} rest=${v#*.}
  local minor=${rest%%[.a-z]*}
  [[ $major =~ ^[0-9]+$ && $minor =~ ^[0-9]+$ ]] || return 1
  (( major > 1 || (major == 1 && minor >= 26) ))
}

# lsp_login_path: the invoking user's PATH as their login shell sets it (empty if unknown).
lsp_login_path() {
  [[ -z ${LSP_TOOLCHAIN_HOME:-} && -n ${SUDO_USER:-} && $SUDO_USER != root ]] || return 0
  command -v sudo > /dev/null || return 0
  timeout 10 sudo -n -u "$SUDO_USER" -i sh -c 'printf %s "$PATH"' 2> /dev/null < /dev/null || true
}

# lsp_first_dir TOOL DIR...: the first DIR holding TOOL, executable (and for go, >= 1.26).
lsp_first_dir() {
  local tool=$1 dir
  shift
  for dir in "$@"; do
    [[ -n $dir && -x $dir/$tool ]] || continue
    [[ $tool != go ]] || lsp_go_ok "$dir/go" || continue
    echo "$dir"
    return 0
  done
  return 1
}

lsp_find_toolchains() {
  local want=" ${*:-go cargo} " home candidate found_go="" found_cargo="" path_dirs=() login_dirs=()
  home=$(lsp_user_home)
  IFS=: read -r -a path_dirs <<< "$PATH"
  found_go=$(lsp_first_dir go "${path_dirs[@]}") || true
  found_cargo=$(lsp_first_dir cargo "${path_dirs[@]}") || true
  # The invoking user's login PATH (a login shell under sudo) only when PATH lacks a tool: the
  # scripts call this several times a run, and after the first call PATH has both.
  if [[ ($want == *" go "* && -z $found_go) || ($want == *" cargo "* && -z $found_cargo) ]]; then
    IFS=: read -r -a login_dirs <<< "$(lsp_login_path)"
  fi
  # Go: the user's login PATH and SDKs, then the system places.
  if [[ -z $found_go ]]; then
    local go_dirs=("${login_dirs[@]}")
    if [[ -n $home ]]; then
      go_dirs+=("$home/.local/go/bin" "$home/go/bin")
      for candidate in "$home"/sdk/go*/bin; do go_dirs+=("$candidate"); done
    fi
    go_dirs+=(/usr/local/go/bin)
    for candidate in /usr/lib/go-1.*/bin; do go_dirs+=("$candidate"); done
    go_dirs+=(/usr/lib/go/bin /snap/bin)
    found_go=$(lsp_first_dir go "${go_dirs[@]}") || true
  fi
  # cargo: the user's login PATH and ~/.cargo/bin, then this user's ~/.cargo/bin.
  if [[ -z $found_cargo ]]; then
    local cargo_dirs=("${login_dirs[@]}")
    [[ -n $home ]] && cargo_dirs+=("$home/.cargo/bin")
    cargo_dirs+=("${CARGO_HOME:-$HOME/.cargo}/bin")
    found_cargo=$(lsp_first_dir cargo "${cargo_dirs[@]}") || true
  fi
  local missing=0
  if [[ $want != *" go "* ]]; then
    :
  elif [[ -n $found_go ]]; then
    [[ :$PATH: == *":$found_go:"* ]] || export PATH="$found_go:$PATH"
  else
    missing=1
    echo "Go (>= 1.26) is required to build the test control plane and was not found on PATH${home:+, in $home} or in /usr/local/go/bin, /usr/lib/go-1.*/bin." >&2
    echo "  Install it (https://go.dev/dl: unpack into /usr/local, giving /usr/local/go/bin/go), or run with your PATH: sudo env \"PATH=\$PATH\" bash ${0##*/}" >&2
  fi
  if [[ $want != *" cargo "* ]]; then
    :
  elif [[ -n $found_cargo ]]; then
    [[ :$PATH: == *":$found_cargo:"* ]] || export PATH="$found_cargo:$PATH"
    # The invoking user's rustup proxy finds its toolchains in their RUSTUP_HOME.
    if [[ -n $home && $found_cargo == "$home/.cargo/bin" && -z ${RUSTUP_HOME:-} && -d $home/.rustup && ! -d $HOME/.rustup ]]; then
      export RUSTUP_HOME="$home/.rustup"
    fi
  else
    missing=1
    echo "Rust (cargo) is required and was not found on PATH${home:+, in $home/.cargo/bin} or in ${CARGO_HOME:-$HOME/.cargo}/bin." >&2
    echo "  Install it (https://rustup.rs), or run with your PATH: sudo env \"PATH=\$PATH\" bash ${0##*/}" >&2
  fi
  return "$missing"
}

# lsp_now_ms: the clock in milliseconds. Whole seconds read twice and subtracted say 2 s for
# one real second that began late in a second; elapsed times are floored from milliseconds.
lsp_now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# lsp_since T0: whole seconds elapsed since T0 ($(lsp_now_ms)).
lsp_since() { echo $(( ($(lsp_now_ms) - $1) / 1000 )); }

# lsp_ticker_start LINE T0: every LSP_TICK seconds (default 60) prints "LINE (N s so far)" to
# stderr, N counted from T0 ($(lsp_now_ms)), until lsp_ticker_stop; its PID is in lsp_ticker. Its
# stdout is /dev/null and its sleep ends with it, so a caller's $(...) does not wait for it.
lsp_ticker_start() {
  local line=$1 t0=$2 tick=${LSP_TICK:-60}
  (
    trap 'kill "$s" 2> /dev/null; exit 0' TERM
    while :; do
      sleep "$tick" & s=$!
      wait "$s"
      echo "$line ($(lsp_since "$t0") s so far)" >&2
    done
  ) > /dev/null &
  lsp_ticker=$!
}

lsp_ticker_stop() {
  [[ -n ${lsp_ticker:-} ]] || return 0
  kill "$lsp_ticker" 2> /dev/null || true
  wait "$lsp_ticker" 2> /dev/null || true
  lsp_ticker=''
}

# lsp_stage WHO WHAT COMMAND...: runs COMMAND, saying before what it builds, every minute that it
# still does (a quiet cargo build waiting on another build's lock of its target directory says
# nothing itself), and after how long it took, so a long first build is not minutes of silence.
lsp_stage() {
  local who=$1 what=$2 t0 rc=0
  shift 2
  t0=$(lsp_now_ms)
  echo "$who: building $what ..." >&2
  lsp_ticker_start "$who: still building $what" "$t0"
  "$@" || rc=$?
  lsp_ticker_stop
  echo "$who: $what $( ((rc == 0)) && echo built || echo "FAILED (exit $rc)") in $(lsp_since "$t0") s" >&2
  return "$rc"
}

# lsp_lock WHO FD LOCKFILE WHAT: takes the lock open on FD (flock); when another process holds
# it, says so (WHAT: what that process builds, and its lock file), every minute that it still
# waits, and how long it waited.
lsp_lock() {
  local who=$1 fd=$2 file=$3 what=$4 t0 holders
  flock -n "$fd" && return 0
  t0=$(lsp_now_ms)
  holders=$(lslocks -n -o PID,PATH 2> /dev/null | awk -v f="$file" '$2 == f {print $1}' | sort -u | tr '\n' ' ')
  echo "$who: waiting for another build of $what to finish (lock $file${holders:+, held by pid ${holders% }}) ..." >&2
  lsp_ticker_start "$who: still waiting for the other build of $what" "$t0"
  flock "$fd"
  lsp_ticker_stop
  echo "$who: waited $(lsp_since "$t0") s for the other build of $what" >&2
}

# lsp_source_date_epoch REPO: SOURCE_DATE_EPOCH when set, else the time of REPO's commit (empty
# without git). The release builds of the scripts all build with it, so the binary's build date
# is the commit's (build.rs) and one script's release build is the next one's, not rebuilt.
lsp_source_date_epoch() {
  if [[ -n ${SOURCE_DATE_EPOCH:-} ]]; then echo "$SOURCE_DATE_EPOCH"; else git -C "$1" log -1 --format=%ct 2> /dev/null || true; fi
}

# lsp_release_binary REPO: where `cargo build --release` run in REPO puts the agent
# (CARGO_TARGET_DIR, relative to REPO when relative, as cargo takes it there).
lsp_release_binary() {
  local target=${CARGO_TARGET_DIR:-target}
  [[ $target == /* ]] || target=$1/$target
  echo "$target/release/local-static-provisioner"
}
