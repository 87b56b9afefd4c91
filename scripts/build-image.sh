#!/usr/bin/env bash
# Builds the release image without a container engine: the Dockerfile's final stage, read from
# the Dockerfile itself (base, copied artifacts, user, entrypoint, cmd) so the two cannot drift
# (an instruction this script does not know fails the build), assembled as a single-layer OCI
# image archive (scripts/oci-image.py; reproducible: the same inputs give the same digest). The
# distroless cc-debian12 base is stood in for by the Debian 12 libraries the binary links,
# copied from this machine, so build on Debian 12 (bookworm) or newer with the same glibc.
# Writes into OUT_DIR (default dist/image):
#   local-static-provisioner-<tag>-<arch>.oci.tar   the image (`ctr images import`, `kind load
#                                                    image-archive`, `skopeo copy oci-archive:...`)
#   local-static-provisioner-<tag>-<arch>.sbom.cdx.json   its SBOM (CycloneDX, every crate linked)
#   SHA256SUMS                                       checksums of both
#   SHA256SUMS                                       checksums of every archive and SBOM built into
#                                                    OUT_DIR (an amd64 and an arm64 build there are both listed)
# and prints "<name> <manifest digest> <layer bytes>", then the archive's path.
# Reproducible: two builds of the same commit give the same digest wherever they are checked out.
# SOURCE_DATE_EPOCH (the binary's build date, the SBOM's timestamp) defaults to the commit's time.
# LSP_PREBUILT_DIR: a directory holding the release binary already built for ARCH (a CI job that
# built it once): packed as it is instead of building it here.
# IMAGE: the image reference to record (default local-static-provisioner:<Chart appVersion>).
# The architecture is this machine's unless ARCH says (amd64 or arm64): another one is
# cross-built with Rust's target for it and Debian's cross linker and libraries
# (`rustup target add aarch64-unknown-linux-gnu`, `apt-get install gcc-aarch64-linux-gnu`); or
# build the Dockerfile with `docker buildx build --platform linux/arm64,linux/amd64`
# (docs/install.md).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$repo/dist/image}
mkdir -p "$out"
out=$(cd "$out" && pwd)
fail() { echo "build-image: $*" >&2; exit 1; }
version=$(awk '$1 == "appVersion:" {gsub(/"/, "", $2); print $2; exit}' "$repo/deploy/helm/local-static-provisioner/Chart.yaml")
image=${IMAGE:-local-static-provisioner:$version}
tag=${image##*:}
[[ $image == *:* && $tag != */* ]] || tag=$version
case $(uname -m) in
  x86_64) host_arch=amd64 ;;
  aarch64) host_arch=arm64 ;;
  *) host_arch=$(uname -m) ;;
esac
# ARCH: the image's architecture (amd64 or arm64), this machine's by default.
arch=${ARCH:-$host_arch}
case $arch in
  amd64) triple=x86_64-unknown-linux-gnu gnu=x86_64-linux-gnu ;;
  arm64) triple=aarch64-unknown-linux-gnu gnu=aarch64-linux-gnu ;;
  *) fail "ARCH=$arch: the image is built for amd64 or arm64" ;;
esac
# shellcheck source=scripts/toolchain.sh
source "$repo/scripts/toolchain.sh"
# The same commit, the same date: the binary's build date and the SBOM's timestamp.
SOURCE_DATE_EPOCH=$(lsp_source_date_epoch "$repo")
if [[ -z $SOURCE_DATE_EPOCH ]]; then
  SOURCE_DATE_EPOCH=$(date +%s)
  echo "build-image: no git history: the build date is now (set SOURCE_DATE_EPOCH for a reproducible archive)" >&2
fi
export SOURCE_DATE_EPOCH
work=$(mktemp -d -t lsp-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
base_name=local-static-provisioner-$tag-$arch
archive=$out/$base_name.oci.tar

dockerfile=$repo/Dockerfile
final_from=$(grep -n '^FROM ' "$dockerfile" | tail -1)
[[ -n $final_from ]] || fail "no FROM in $dockerfile"
base=$(awk '{print $2}' <<< "${final_from#*:}")
case $base in
  gcr.io/distroless/cc-debian12*) ;;
  *) fail "the Dockerfile's final stage is FROM $base; teach scripts/build-image.sh its base" ;;
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
release=$(dirname "$(lsp_release_binary "$repo")")
# The SBOM is written here, never into a prebuilt directory.
sbom_dir=$work/release
mkdir -p "$sbom_dir"
sbom_target=()
[[ $arch == "$host_arch" ]] || sbom_target=("LSP_SBOM_TARGET=$triple")
if [[ -n ${LSP_PREBUILT_DIR:-} ]]; then
  release=$(cd "$LSP_PREBUILT_DIR" && pwd) || fail "LSP_PREBUILT_DIR=$LSP_PREBUILT_DIR is not a directory"
  echo "build-image: packing the binary in $release (LSP_PREBUILT_DIR), not building it" >&2
elif [[ $arch == "$host_arch" ]]; then
  (cd "$repo" && lsp_stage image "the agent (cargo build --release)" cargo build --release --locked -q)
else
  # Cross-built: Rust's target for the architecture, Debian's cross linker, and the image's
  # libraries from Debian's cross packages of the same release (libc6-<arch>-cross).
  [[ -d $(rustc --print target-libdir --target "$triple" 2> /dev/null) ]] \
    || fail "ARCH=$arch needs Rust's $triple target: rustup target add $triple"
  command -v "$gnu-gcc" > /dev/null && [[ -d /usr/$gnu/lib ]] \
    || fail "ARCH=$arch needs a cross linker and its libraries: apt-get install gcc-$gnu (Debian 12 or newer)"
  upper=${triple^^}
  release=$(dirname "$release")/$triple/release
  (cd "$repo" && export "CARGO_TARGET_${upper//-/_}_LINKER=$gnu-gcc" "CC_${triple//-/_}=$gnu-gcc" \
    && lsp_stage image "the agent for $arch (cargo build --release --target $triple)" \
      cargo build --release --locked -q --target "$triple")
fi
env "${sbom_target[@]}" bash "$repo/scripts/sbom.sh" "$sbom_dir/local-static-provisioner.cdx.json" \
  || fail "the SBOM (scripts/sbom.sh) failed"

files=()
for copy in "${copies[@]}"; do
  artifact=$release/${copy%%:*}
  [[ -f $sbom_dir/${copy%%:*} ]] && artifact=$sbom_dir/${copy%%:*}
  [[ -f $artifact ]] || fail "$artifact was not built"
  if [[ ! -x $artifact ]]; then
    files+=(--file "$artifact:${copy#*:}:0644")
    continue
  fi
  files+=(--file "$artifact:${copy#*:}:0755")
  # The distroless cc base: glibc, libgcc and the loader, as the binary links them.
  if [[ $arch == "$host_arch" ]]; then
    while read -r lib; do
      [[ -f $lib ]] && files+=(--file "$(readlink -f "$lib"):$lib:0755")
    done < <(ldd "$artifact" | awk '$2 == "=>" {print $3} $1 ~ /^\// {print $1}')
  else
    # The libraries it names (and the loader it asks for) from the cross packages, at the
    # places the architecture's Debian has them (the loader searches /lib/<gnu> by default).
    loader=$(readelf -l "$artifact" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
    [[ -n $loader && -f /usr/$gnu/lib/${loader##*/} ]] || fail "$artifact: no loader found for ${loader:-?}"
    files+=(--file "$(readlink -f "/usr/$gnu/lib/${loader##*/}"):$loader:0755")
    while read -r lib; do
      [[ -f /usr/$gnu/lib/$lib ]] || fail "$artifact needs $lib, which /usr/$gnu/lib lacks"
      files+=(--file "$(readlink -f "/usr/$gnu/lib/$lib"):/lib/$gnu/$lib:0755")
    done < <(readelf -d "$artifact" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  fi
done
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$work/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$work/group"
agent_args=(--name "$image" --arch "$arch" --file "$work/passwd:/etc/passwd:0644" --file "$work/group:/etc/group:0644"
  --dir tmp:1777 --dir home/nonroot "${files[@]}")
[[ -n $entrypoint ]] && agent_args+=(--entrypoint "$entrypoint")
[[ -n $cmd ]] && agent_args+=(--cmd "$cmd")
[[ -n $user ]] && agent_args+=(--user "$user")
line=$(python3 "$repo/scripts/oci-image.py" "$archive" "${agent_args[@]}")


cp "$sbom_dir/local-static-provisioner.cdx.json" "$out/$base_name.sbom.cdx.json"
# SHA256SUMS lists every archive and SBOM of OUT_DIR: this build's lines replace their own, the
# other builds' (another architecture or tag) stay.
(
  cd "$out"
  { [[ -f SHA256SUMS ]] && grep -v -F -e "  $base_name.oci.tar" -e "  $base_name.sbom.cdx.json" SHA256SUMS || true
    sha256sum "$base_name.oci.tar" "$base_name.sbom.cdx.json"; } | sort -k 2 > SHA256SUMS.tmp
  mv SHA256SUMS.tmp SHA256SUMS
)
echo "$line"
echo "$archive"
