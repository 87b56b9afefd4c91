#!/usr/bin/env bash
# The image's software bill of materials: a CycloneDX 1.5 JSON SBOM of the agent binary (every
# crate it links, from Cargo.lock, with versions, hashes and licences; no dev or build-only
# dependencies), written where the image build copies it from. Every build of the image runs it:
# the Dockerfile's build stage and the test node's image (tests/node/images/build.sh).
#
# Usage: sbom.sh [OUT]   default OUT: $CARGO_TARGET_DIR or target/, then release/local-static-provisioner.cdx.json
# LSP_SBOM_TARGET: the Rust target the binary is built for (a cross build), this machine's by default.
#
# Reproducible: the same commit gives the same bytes wherever it is checked out. The checkout's
# path is written as /src (where the Dockerfile builds), the timestamp is SOURCE_DATE_EPOCH
# (default: the commit's time; without git, the generator's clock), and the serial number is a
# UUID made from the document's own content (a different SBOM, a different serial number).
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
  if ! flock -n 9; then
    t0=$(date +%s)
    echo "sbom: waiting for another build of cargo-cyclonedx into $tool (lock $tool/.lock) ..." >&2
    flock 9
    echo "sbom: waited $(( $(date +%s) - t0 )) s for the other build of cargo-cyclonedx" >&2
  fi
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
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2> /dev/null || true)}
mkdir -p "$(dirname "$out")"
python3 - "$repo/$name.json" "$repo" "$epoch" > "$out.tmp" <<'PY'
import datetime, hashlib, json, sys, uuid
path, repo, epoch = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(path).read()
if repo != "/src":
    # As JSON writes it: path+file:///checkout#crate@version in bom-refs.
    text = text.replace("file://" + repo + "#", "file:///src#").replace(json.dumps(repo)[1:-1], "/src")
bom = json.loads(text)
if epoch:
    stamp = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
    bom.setdefault("metadata", {})["timestamp"] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
bom.pop("serialNumber", None)
digest = hashlib.sha256(json.dumps(bom, sort_keys=True).encode()).digest()
bom["serialNumber"] = "urn:uuid:" + str(uuid.UUID(bytes=digest[:16], version=5))
json.dump(bom, sys.stdout, indent=2)
sys.stdout.write("\n")
PY
mv "$out.tmp" "$out"
rm -f "$repo/$name.json"
echo "sbom: $out" >&2
