#!/bin/sh
# Upstream-compatible block cleaner: erase filesystem and partition signatures so the device
# looks new. The agent's built-in `blockCleanMethod: quick` does the same without a shell.
set -eu
dev=${LOCAL_PV_BLKDEVICE:?LOCAL_PV_BLKDEVICE is not set}
echo "quick reset of $dev"
ionice -c 3 wipefs --all --force "$dev"
