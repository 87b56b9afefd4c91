#!/bin/sh
# Upstream-compatible block cleaner: overwrite the device N times with random data, then
# zeroes (`shred -vzf -n N`, N defaults to 1). No built-in equivalent: use the image variant
# that carries a shell and coreutils, or mount this script.
set -eu
dev=${LOCAL_PV_BLKDEVICE:?LOCAL_PV_BLKDEVICE is not set}
passes=${1:-1}
echo "shredding $dev with $passes pass(es)"
ionice -c 3 shred -vzf -n "$passes" "$dev"
