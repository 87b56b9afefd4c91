#!/bin/sh
# Upstream-compatible block cleaner: discard every block. Built-in equivalent:
# `blockCleanMethod: discard`.
set -eu
dev=${LOCAL_PV_BLKDEVICE:?LOCAL_PV_BLKDEVICE is not set}
echo "discarding $dev"
blkdiscard "$dev"
