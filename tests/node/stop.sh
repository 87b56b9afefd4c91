#!/usr/bin/env bash
# Stops the node start.sh started in DIR and puts the host back as start.sh recorded it
# (DIR/host-state): every container and shim of our runtime, kubelet and containerd (by the PIDs
# recorded, nothing else), every mount under kubelet's root and our runtime's directories, the
# sysctls kubelet set, the directories and cgroups it created, its iptables chains.
# Safe to run twice, and after a start that failed half-way.
set -uo pipefail
dir=${1:?usage: stop.sh DIR}
[[ -d $dir ]] || exit 0
dir=$(cd "$dir" && pwd)
state=$dir/host-state
KUBELET_ROOT=/var/lib/kubelet

stop_pids() {
  local pids=$1 _
  [[ -n $pids ]] || return 0
  # shellcheck disable=SC2086
  kill -TERM $pids 2> /dev/null
  for _ in $(seq 1 50); do
    local alive=0 pid
    for pid in $pids; do kill -0 "$pid" 2> /dev/null && alive=1; done
    (( alive )) || return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -KILL $pids 2> /dev/null
}

# kubelet first, so nothing restarts the containers we stop next.
if [[ -f $dir/pids ]]; then
  stop_pids "$(awk '$2 == "kubelet" {print $1}' "$dir/pids")"
fi

# Every container of our runtime, then its shims (their PIDs are in our runtime's state).
if [[ -S $dir/containerd.sock && -f $dir/runtime-bin ]]; then
  bin=$(cat "$dir/runtime-bin")
  if [[ -x $bin/ctr ]]; then
    ctr() { timeout 20 "$bin/ctr" --address "$dir/containerd.sock" --namespace k8s.io "$@"; }
    for task in $(ctr tasks ls -q 2> /dev/null); do ctr tasks kill --all --signal SIGKILL "$task" > /dev/null 2>&1; done
    sleep 0.5
    for task in $(ctr tasks ls -q 2> /dev/null); do ctr tasks delete --force "$task" > /dev/null 2>&1; done
  fi
fi
shims=$(cat "$dir"/containerd/state/io.containerd.runtime.v2.task/*/*/shim.pid 2> /dev/null | tr '\n' ' ')
stop_pids "$shims"
if [[ -f $dir/pids ]]; then
  stop_pids "$(awk '$2 != "kubelet" {print $1}' "$dir/pids")"
  : > "$dir/pids"
fi

# Mounts: pods' volumes and tokens under kubelet's root, rootfs and shm mounts of our runtime.
# Deepest first; lazily if something still holds one (a test disk is unmounted, never deleted).
unmount_under() {
  local root=$1 m
  while read -r m; do
    umount "$m" 2> /dev/null || umount -l "$m" 2> /dev/null
  done < <(awk -v r="$root" '{ p = $5; gsub(/\\040/, " ", p); if (p == r || index(p, r "/") == 1) print p }' \
             /proc/self/mountinfo | sort -r)
}
unmount_under "$KUBELET_ROOT"
unmount_under "$dir"
# The discovery directories start.sh bound onto themselves (and what tests left mounted there).
if [[ -f $state ]]; then
  for d in $(awk '$1 == "bound" {print $2}' "$state"); do unmount_under "$d"; done
fi

# The boot fence's note that this boot is fenced (restart.sh up, start.sh): ours, under /run.
rm -f /run/local-static-provisioner/boot-fenced
rmdir /run/local-static-provisioner 2> /dev/null || true

[[ -f $state ]] || exit 0
while read -r kind what value; do
  case $kind in
    sysctl) sysctl -qw "$what=$value" 2> /dev/null || echo "real node: could not restore $what=$value" >&2 ;;
    absent)
      case $what in
        kubepods-cgroups)
          # Leaves first: a cgroup directory goes only when it has no children and no tasks.
          for c in /sys/fs/cgroup/*/kubepods; do
            [[ -d $c ]] && find "$c" -depth -type d -exec rmdir {} + 2> /dev/null
          done ;;
        "$KUBELET_ROOT")
          # Every mount under it is gone by now; never cross into a file system still mounted.
          if ! awk -v r="$KUBELET_ROOT" 'index($5, r "/") == 1 {found=1} END {exit !found}' /proc/self/mountinfo; then
            rm -rf --one-file-system "$KUBELET_ROOT"
          else
            echo "real node: mounts remain under $KUBELET_ROOT; left in place" >&2
          fi ;;
        *) rm -rf --one-file-system "$what" ;;
      esac ;;
    chain)
      if [[ $value == absent ]] && command -v iptables > /dev/null; then
        for hook in INPUT OUTPUT; do
          while iptables -w -D "$hook" -j "$what" 2> /dev/null; do :; done
          while iptables -w -t nat -D "$hook" -j "$what" 2> /dev/null; do :; done
        done
        for table in filter nat mangle; do
          iptables -w -t "$table" -F "$what" 2> /dev/null && iptables -w -t "$table" -X "$what" 2> /dev/null
        done
      fi ;;
  esac
done < "$state"
rm -f "$state"
active=/run/lsp-test-node.active
[[ -f $active && $(cat "$active") == "$dir" ]] && rm -f "$active"
exit 0
