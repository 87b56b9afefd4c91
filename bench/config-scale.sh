#!/usr/bin/env bash
# Benchmark (not a test): `validate-config` on a ConfigMap directory with N storage classes
# (default sizes 1000 2000 4000 8000), each with its own existing discovery directory so the
# root checks do their real work. Needs no root and no control plane. Prints one JSON line per
# size and a table; never fails on timing (only when validate-config refuses the config).
# BIN=/path/to/local-static-provisioner skips the build and times that binary instead (to
# compare two builds).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(1000 2000 4000 8000)
if [[ -z "${BIN:-}" ]]; then
  (cd "$repo" && cargo build --release --locked -q)
  BIN=${CARGO_TARGET_DIR:-$repo/target}/release/local-static-provisioner
fi
work=$(mktemp -d -t lsp-config-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

now() { date +%s.%N; }
elapsed() { python3 -c "print(round($2 - $1, 3))"; }

rows=()
for n in "${sizes[@]}"; do
  dir=$work/n$n
  # The upstream ConfigMap layout: a timestamped directory, ..data pointing at it, one
  # symlink per key.
  python3 - "$dir" "$n" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
stamp = os.path.join(root, "config", "..2026_01_01_00_00_00.000000001")
os.makedirs(stamp)
with open(os.path.join(stamp, "storageClassMap"), "w") as f:
    for i in range(n):
        disks = os.path.join(root, "disks", f"class-{i}")
        os.makedirs(disks)
        f.write(f"class-{i}:\n  hostDir: {disks}\n  mountDir: {disks}\n"
                f"  namePattern: \"nvme*,disk*\"\n  volumeMode: {'Block' if i % 2 else 'Filesystem'}\n")
with open(os.path.join(stamp, "minResyncPeriod"), "w") as f:
    f.write("5m0s\n")
os.symlink(os.path.basename(stamp), os.path.join(root, "config", "..data"))
for key in ("storageClassMap", "minResyncPeriod"):
    os.symlink(f"..data/{key}", os.path.join(root, "config", key))
PY
  start=$(now)
  if ! "$BIN" validate-config --config-dir "$dir/config" > "$work/out" 2> "$work/err"; then
    echo "config-scale: validate-config refused the generated config with $n classes:" >&2
    head -n 20 "$work/err" >&2
    exit 1
  fi
  secs=$(elapsed "$start" "$(now)")
  echo "{\"figure\":\"config_validate\",\"classes\":$n,\"seconds\":$secs}"
  rows+=("$n $secs")
  rm -rf "$dir"
done
printf '%-16s %8s %10s\n' figure classes seconds
for row in "${rows[@]}"; do
  read -r n secs <<< "$row"
  printf '%-16s %8s %10s\n' config_validate "$n" "$secs"
done
