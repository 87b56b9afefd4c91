#!/bin/sh
# Upstream-compatible block cleaner: write zeroes over the whole device. Built-in equivalent
# (offloaded with BLKZEROOUT where the device supports it): `blockCleanMethod: zero`.
set -eu
dev=${LOCAL_PV_BLKDEVICE:?LOCAL_PV_BLKDEVICE is not set}
echo "zeroing $dev"
if ! ionice -c 3 blkdiscard --zeroout "$dev"; then
  size=$(blockdev --getsize64 "$dev")
  ionice -c 3 dd if=/dev/zero of="$dev" bs=1M count=$((size / 1048576)) oflag=direct status=none
fi
