#!/usr/bin/env bash
# The image's software bill of materials: a CycloneDX 1.5 JSON SBOM of the agent binary (every
# crate it links, from Cargo.lock, with versions, hashes and licences; no dev or build-only
# dependencies), written where the image build copies it from. Every build of the image runs it:
# the Dockerfile's build stage and the test node's image (tests/node/images/build.sh).
#
# Usage: sbom.sh [OUT]   default OUT: $CARGO_TARGET_DIR or target/, then release/local-static-provisioner.cdx.json
# LSP_SBOM_TARGET: the Rust target the binary is built for (a cross build), this machine's by default.
#
# The generator is cargo-cyclonedx (the CycloneDX project's own tool for Cargo), pinned and
# installed once into a cache outside the repository ($LSP_CACHE_DIR, default
# ~/.cache/local-static-provisioner; about 1.5 minutes to build the first time).
set -euo pipefail
CYCLONEDX_VERSION=0.5.9
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-${CARGO_TARGET_DIR:-$repo/target}/release/local-static-provisioner.cdx.json}
cache_root=${LSP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/local-static-provisioner}
tool="$cache_root/cargo-cyclonedx-$CYCLONEDX_VERSION"
if [[ ! -x "$tool/bin/cargo-cyclonedx" ]]; then
  mkdir -p "$tool"
  exec 9> "$tool/.lock"
  flock 9
  if [[ ! -x "$tool/bin/cargo-cyclonedx" ]]; then
    echo "sbom: building cargo-cyclonedx $CYCLONEDX_VERSION into $tool (first time only)" >&2
    cargo install --quiet --locked --root "$tool" --version "$CYCLONEDX_VERSION" cargo-cyclonedx >&2
  fi
  exec 9>&-
fi
# cargo-cyclonedx writes next to Cargo.toml; a private name, moved away at once.
name="sbom-$$"
trap 'rm -f "$repo/$name.json"' EXIT
(cd "$repo" && PATH="$tool/bin:$PATH" cargo cyclonedx --quiet --format json --spec-version 1.5 \
  --no-build-deps --target "${LSP_SBOM_TARGET:-$(rustc -vV | sed -n 's/^host: //p')}" --override-filename "$name")
mkdir -p "$(dirname "$out")"
mv "$repo/$name.json" "$out"
echo "sbom: $out" >&2
