#!/usr/bin/env bash
# Power-cycles the node start.sh started in DIR, as a crash and a reboot would, in two steps so
# that a test can change the host while the node is off (swap its disks):
#   restart.sh DIR down   kubelet, every container and shim, and containerd killed with SIGKILL
#                         (nothing stops gracefully: no agent sets a fence on its way out), and
#                         every mount under kubelet's root and the runtime's state gone, as after
#                         a power loss; the disks and the rest of the host stay as they are;
#   restart.sh DIR up     what a boot repeats (boot.sh): containerd, the boot fence as systemd
#                         would run it before kubelet, kubelet with the same configuration,
#                         credentials and images; it starts the node's pods again, as after a
#                         reboot, and returns once the node is Ready.
#   restart.sh DIR kubelet-down   kubelet alone killed with SIGKILL (a kubelet restart within a
#                         boot: containers, mounts and /run stay);
#   restart.sh DIR kubelet-up     the boot fence as systemd runs it before each kubelet start
#                         (ExecStartPre), then kubelet; returns once the node is Ready.
# stop.sh DIR still stops the node and restores the host afterwards.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$(cd "${1:?usage: restart.sh DIR down|up}" && pwd)
step=${2:?usage: restart.sh DIR down|up}
KUBELET_ROOT=/var/lib/kubelet
# shellcheck disable=SC1091
source "$dir/env"
bin=$NODE_BIN
sock=$CONTAINERD_SOCK
cp_dir=$(cat "$dir/control-plane-dir")
# shellcheck disable=SC1091
source "$cp_dir/env"
kubectl() { "$CONTROL_PLANE_BIN/kubectl" --kubeconfig "$cp_dir/admin.kubeconfig" "$@"; }
# shellcheck source=tests/lib.sh
source "$here/../lib.sh"
fail() { echo "real node restart: $*" >&2; exit 1; }
# shellcheck source=tests/node/boot.sh
source "$here/boot.sh"

kill_now() {
  local pid
  for pid in "$@"; do kill -KILL "$pid" 2> /dev/null || true; done
  for pid in "$@"; do while kill -0 "$pid" 2> /dev/null; do sleep 0.05; done; done
}

unmount_under() {
  local root=$1 m
  while read -r m; do
    umount "$m" 2> /dev/null || umount -l "$m" 2> /dev/null || true
  done < <(awk -v r="$root" '{ p = $5; gsub(/\\040/, " ", p); if (index(p, r "/") == 1) print p }' \
             /proc/self/mountinfo | sort -r)
}

case $step in
  down)
    # shellcheck disable=SC2046
    kill_now $(awk '$2 == "kubelet" {print $1}' "$dir/pids")
    # Every container of our runtime by the PID it reports, then its shim (the container's
    # parent), then containerd.
    tasks=$(ctr tasks ls 2> /dev/null | awk 'NR > 1 {print $2}')
    shims=""
    for pid in $tasks; do
      shims+=" $(awk '{print $4}' "/proc/$pid/stat" 2> /dev/null)"
    done
    # shellcheck disable=SC2086
    kill_now $tasks
    # shellcheck disable=SC2086
    kill_now $(printf '%s\n' $shims | sort -u)
    # shellcheck disable=SC2046
    kill_now $(awk '$2 == "containerd" {print $1}' "$dir/pids")
    awk '$2 != "kubelet" && $2 != "containerd"' "$dir/pids" > "$dir/pids.tmp" && mv "$dir/pids.tmp" "$dir/pids"
    # What a power loss takes: every mount of pods and of the runtime, and the runtime's state
    # (/run on a real host).
    unmount_under "$KUBELET_ROOT"
    unmount_under "$dir/containerd"
    rm -rf "$dir/containerd/state" /run/local-static-provisioner/boot-fenced
    echo "real node $NODE_NAME: down (killed, mounts gone)" >&2
    ;;
  up)
    start_containerd
    boot_fence
    start_kubelet
    echo "real node $NODE_NAME: up again" >&2
    ;;
  kubelet-down)
    # shellcheck disable=SC2046
    kill_now $(awk '$2 == "kubelet" {print $1}' "$dir/pids")
    awk '$2 != "kubelet"' "$dir/pids" > "$dir/pids.tmp" && mv "$dir/pids.tmp" "$dir/pids"
    echo "real node $NODE_NAME: kubelet killed" >&2
    ;;
  kubelet-up)
    boot_fence
    start_kubelet
    echo "real node $NODE_NAME: kubelet up again" >&2
    ;;
  *) echo "usage: restart.sh DIR down|up|kubelet-down|kubelet-up" >&2; exit 2 ;;
esac
