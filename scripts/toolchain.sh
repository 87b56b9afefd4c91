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

# lsp_stage WHO WHAT COMMAND...: runs COMMAND, saying before what it builds and after how long it
# took, so a long first build is not minutes of silence.
lsp_stage() {
  local who=$1 what=$2 t0 rc=0
  shift 2
  t0=$(date +%s)
  echo "$who: building $what ..." >&2
  "$@" || rc=$?
  echo "$who: $what $( ((rc == 0)) && echo built || echo "FAILED (exit $rc)") in $(( $(date +%s) - t0 )) s" >&2
  return "$rc"
}

# lsp_release_binary REPO: where `cargo build --release` run in REPO puts the agent
# (CARGO_TARGET_DIR, relative to REPO when relative, as cargo takes it there).
lsp_release_binary() {
  local target=${CARGO_TARGET_DIR:-target}
  [[ $target == /* ]] || target=$1/$target
  echo "$target/release/local-static-provisioner"
}
