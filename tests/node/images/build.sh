#!/usr/bin/env bash
# Assembles the images the real test node runs, as OCI archives that `ctr images import` takes
# (no container engine and no registry exist here):
#   pause   the pod sandbox (pause.c, static)
#   shell   workloads: busybox-static with its applets
#   agent   the release image users get: scripts/build-image.sh (the Dockerfile's final stage,
#           built without a container engine).
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
oci() { python3 "$repo/scripts/oci-image.py" "$@"; }
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

# ---- agent: the release image, as users get it (scripts/build-image.sh) ----
# The whole output, then its first line: `| head -1` may exit before the script's second
# line, which then dies of SIGPIPE and fails the build under pipefail.
agent_out=$(IMAGE=$AGENT_IMAGE bash "$repo/scripts/build-image.sh" "$work/agent")
agent_line=${agent_out%%$'\n'*}
mv "$work/agent/"*.oci.tar "$out/agent.tar"

printf '%s\n' "$pause_line" "$shell_line" "$agent_line" > "$out/images"
cat "$out/images" >&2
