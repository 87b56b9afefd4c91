#!/usr/bin/env bash
# Installs the tools the tests and the demo use that a fresh machine of this kind may lack.
# Go and Rust come with the machine; everything else is a Debian package. Idempotent and quiet:
# it prints nothing when nothing is missing. The demo and tests/run.sh call it themselves.
set -euo pipefail
need=()
# tests/host/device_content.rs makes each on-disk signature with its real tool (mkswap ...
# mksquashfs); tests/cluster/failing_disks.rs wedges volumes (fsfreeze, a FUSE mount whose daemon is
# stopped: bindfs); tests/cluster/wedged_disks.rs: 100 such bindfs mounts, and failing disks served
# by python3 over /dev/fuse; tests/cluster/host_defects.rs mounts a vfat volume through fusefat
# where the kernel has no vfat driver.
for tool in openssl:openssl curl:curl mount:mount losetup:mount mkfs.ext4:e2fsprogs chattr:e2fsprogs mkfs.xfs:xfsprogs \
            blkid:util-linux wipefs:util-linux partx:util-linux sfdisk:fdisk flock:util-linux setsid:util-linux \
            python3:python3 truncate:coreutils readelf:binutils mkswap:util-linux \
            mkfs.btrfs:btrfs-progs mkfs.vfat:dosfstools pvcreate:lvm2 cryptsetup:cryptsetup-bin \
            make-bcache:bcache-tools mkfs.f2fs:f2fs-tools mkfs.ntfs:ntfs-3g mksquashfs:squashfs-tools \
            fsfreeze:util-linux debugfs:e2fsprogs xfs_io:xfsprogs bindfs:bindfs fusefat:fusefat \
            aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu qemu-aarch64:qemu-user; do
  command -v "${tool%%:*}" > /dev/null || need+=("${tool#*:}")
done
# scripts/check-image.sh cross-builds the arm64 image (Debian's cross linker and libraries) and
# starts its binary under qemu-user.
# The real test node (tests/node/): runc's seccomp support links libseccomp; the workload and
# pause images are assembled from busybox-static.
[[ -f /usr/include/seccomp.h ]] || need+=(libseccomp-dev)
[[ -f /usr/aarch64-linux-gnu/include/stdint.h ]] || need+=(libc6-dev-arm64-cross)
command -v pkg-config > /dev/null || need+=(pkg-config)
dpkg-query -W -f '${Status}' busybox-static 2> /dev/null | grep -q 'ok installed' || need+=(busybox-static)
if (( ${#need[@]} )) && (( EUID != 0 )); then
  # Not root: nothing can be installed. The tests that need these tools need root anyway and
  # skip with a message; say which packages a root run would install.
  echo "install-deps: missing Debian packages (install as root: sudo bash scripts/install-deps.sh): ${need[*]}" >&2
elif (( ${#need[@]} )); then
  echo "installing: ${need[*]}" >&2
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" > /dev/null
fi
# Go and cargo, also under sudo (whose secure_path drops their usual places): scripts/toolchain.sh.
# shellcheck source=scripts/toolchain.sh
source "$(dirname "${BASH_SOURCE[0]}")/toolchain.sh"
lsp_find_toolchains || exit 1
for tool in cargo-clippy rustfmt; do
  command -v "$tool" > /dev/null || { echo "$tool is required (rustup component add clippy rustfmt)" >&2; exit 1; }
done
# Rust's arm64 target, for the cross-built arm64 image (scripts/check-image.sh). Added as the
# owner of the toolchain under sudo, so root leaves no files in their ~/.rustup.
arm64=aarch64-unknown-linux-gnu
if command -v rustup > /dev/null && ! rustup target list --installed 2> /dev/null | grep -qx "$arm64"; then
  echo "installing Rust's $arm64 target" >&2
  if (( EUID == 0 )) && [[ -n ${SUDO_USER:-} && $SUDO_USER != root && ${RUSTUP_HOME:-} == /* ]]; then
    sudo -n -u "$SUDO_USER" env "PATH=$PATH" "RUSTUP_HOME=$RUSTUP_HOME" rustup target add "$arm64" > /dev/null
  else
    rustup target add "$arm64" > /dev/null
  fi || echo "install-deps: could not add Rust's $arm64 target (rustup target add $arm64); the arm64 image check will fail" >&2
fi
