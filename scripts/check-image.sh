#!/usr/bin/env bash
# What can be checked of the image without a container engine: the Dockerfile copies the
# release binary this script builds (same path, same locked build), the binary is stripped, it
# starts, and the `full` variant's scripts exist. Prints the figures; fails on a mismatch.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --locked -q
rel=target/release/local-static-provisioner  # where the image build puts it
bin=${CARGO_TARGET_DIR:-target}/release/local-static-provisioner  # where this build did
grep -q "cargo build --release --locked" Dockerfile || { echo "Dockerfile does not build with --locked" >&2; exit 1; }
grep -q "COPY --from=build /src/$rel " Dockerfile || { echo "Dockerfile does not copy $rel" >&2; exit 1; }
for s in quick_reset.sh shred.sh dd_zero.sh blkdiscard.sh; do
  [[ -x deploy/scripts/$s ]] || { echo "deploy/scripts/$s missing or not executable" >&2; exit 1; }
done
# The image copies the binary as built; the release profile strips it (no symbol table left).
if readelf -S "$bin" | grep -q '\.symtab'; then
  echo "$bin has a symbol table: [profile.release] in Cargo.toml should strip it" >&2; exit 1
fi
"$bin" version
"$bin" --help > /dev/null
echo "release binary (as in the image): $(du -k "$bin" | cut -f1) KiB"
echo "dynamic libraries: $(ldd "$bin" | awk '{print $1}' | tr '\n' ' ')"
