#!/usr/bin/env bash
# Assembles the images the real test node runs, as OCI archives that `ctr images import` takes
# (no container engine and no registry exist here):
#   pause   the pod sandbox (pause.c, static)
#   shell   workloads: busybox-static with its applets
#   agent   the Dockerfile's final stage: read from the Dockerfile itself (base, copied binary,
#           user, entrypoint, cmd), so the two cannot drift; any instruction this script does not
#           know fails the build. The distroless cc-debian12 base is stood in for by the same
#           Debian 12 libraries the binary links, copied from this host.
# Usage: build.sh OUT_DIR     writes OUT_DIR/{pause,shell,agent}.tar and OUT_DIR/images (one line
#                             per image: name and manifest digest). Builds the release binary.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
out=${1:?usage: build.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d -t lsp-images.XXXXXX)
trap 'rm -rf "$work"' EXIT
oci() { python3 "$here/oci-image.py" "$@"; }
fail() { echo "images: $*" >&2; exit 1; }

PAUSE_IMAGE=${PAUSE_IMAGE:-registry.local/lsp-test/pause:1}
SHELL_IMAGE=${SHELL_IMAGE:-registry.local/lsp-test/shell:1}
AGENT_IMAGE=${AGENT_IMAGE:-docker.io/library/local-static-provisioner:e2e}

# ---- pause ----
gcc -static -Os -s -o "$work/pause" "$here/pause.c"
pause_line=$(oci "$out/pause.tar" --name "$PAUSE_IMAGE" --entrypoint '["/pause"]' --user 65535:65535 \
  --file "$work/pause:/pause:0755")

# ---- shell: busybox-static and a link per applet ----
busybox=/bin/busybox
[[ -x $busybox ]] && ! ldd "$busybox" > /dev/null 2>&1 \
  || fail "$busybox is missing or not static (scripts/install-deps.sh installs busybox-static)"
links=()
for applet in $("$busybox" --list); do
  [[ $applet == busybox ]] || links+=(--symlink "bin/$applet:/bin/busybox")
done
shell_line=$(oci "$out/shell.tar" --name "$SHELL_IMAGE" --cmd '["/bin/sh"]' \
  --file "$busybox:/bin/busybox:0755" "${links[@]}" --dir tmp:1777)

# ---- agent: the Dockerfile's final stage ----
dockerfile=$repo/Dockerfile
final_from=$(grep -n '^FROM ' "$dockerfile" | tail -1)
[[ -n $final_from ]] || fail "no FROM in $dockerfile"
base=$(awk '{print $2}' <<< "${final_from#*:}")
case $base in
  gcr.io/distroless/cc-debian12*) ;;
  *) fail "the Dockerfile's final stage is FROM $base; teach tests/node/images/build.sh its base" ;;
esac
entrypoint='' cmd='' user='' copies=()
while IFS= read -r line; do
  [[ -z $line || $line == \#* ]] && continue
  read -r instruction rest <<< "$line"
  case $instruction in
    COPY)
      read -r from src dst extra <<< "$rest"
      [[ $from == --from=build && -n $dst && -z ${extra:-} ]] || fail "unsupported final-stage line: $line"
      [[ $src == /src/target/release/* ]] || fail "final stage copies $src, not a release artifact: $line"
      copies+=("${src#/src/target/release/}:$dst") ;;
    USER) user=$rest ;;
    ENTRYPOINT) entrypoint=$rest ;;
    CMD) cmd=$rest ;;
    *) fail "the Dockerfile's final stage has '$instruction', which this script cannot reproduce: $line" ;;
  esac
done < <(tail -n +"${final_from%%:*}" "$dockerfile" | tail -n +2)
(( ${#copies[@]} )) || fail "the Dockerfile's final stage copies nothing"
for json in "$entrypoint" "$cmd"; do
  [[ -z $json ]] || python3 -c 'import json,sys; json.loads(sys.argv[1])' "$json" \
    || fail "ENTRYPOINT/CMD must be in JSON form: $json"
done

# As the Dockerfile's build stage: the release binary, then its SBOM.
# shellcheck source=scripts/toolchain.sh
source "$repo/scripts/toolchain.sh"
(cd "$repo" && lsp_stage images "the agent (cargo build --release)" cargo build --release --locked -q && bash scripts/sbom.sh 2> /dev/null)
release=$(dirname "$(lsp_release_binary "$repo")")
files=()
for copy in "${copies[@]}"; do
  artifact=$release/${copy%%:*}
  [[ -f $artifact ]] || fail "$artifact was not built"
  if [[ ! -x $artifact ]]; then
    files+=(--file "$artifact:${copy#*:}:0644")
    continue
  fi
  files+=(--file "$artifact:${copy#*:}:0755")
  # The distroless cc base: glibc, libgcc and the loader, as the binary links them.
  while read -r lib; do
    [[ -f $lib ]] && files+=(--file "$(readlink -f "$lib"):$lib:0755")
  done < <(ldd "$artifact" | awk '$2 == "=>" {print $3} $1 ~ /^\// {print $1}')
done
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$work/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$work/group"
agent_args=(--name "$AGENT_IMAGE" --file "$work/passwd:/etc/passwd:0644" --file "$work/group:/etc/group:0644"
  --dir tmp:1777 --dir home/nonroot "${files[@]}")
[[ -n $entrypoint ]] && agent_args+=(--entrypoint "$entrypoint")
[[ -n $cmd ]] && agent_args+=(--cmd "$cmd")
[[ -n $user ]] && agent_args+=(--user "$user")
agent_line=$(oci "$out/agent.tar" "${agent_args[@]}")

printf '%s\n' "$pause_line" "$shell_line" "$agent_line" > "$out/images"
cat "$out/images" >&2
