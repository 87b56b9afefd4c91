# The part of a node's start that a reboot repeats, sourced by start.sh and restart.sh: containerd,
# the boot fence, kubelet. Needs dir, bin, sock, NODE_NAME, KUBELET_ROOT, CONTROL_PLANE_BIN, the
# functions launch, wait_for, fail and kubectl, and the configuration files start.sh wrote in dir.

start_containerd() {
  PATH=$bin:$PATH launch containerd "$bin/containerd" --config "$dir/containerd.toml"
  wait_for "containerd not answering" 30 ctr version
}

ctr() { "$bin/ctr" --address "$sock" --namespace k8s.io "$@"; }

# The boot fence of deploy/host/10-local-volume-fence.conf, as systemd would run it before
# kubelet: once the agent has put its binary on this host, a node (re)started here sets the
# node-wide volume fence before kubelet starts any pod.
boot_fence() {
  local fence_bin=/var/lib/local-static-provisioner/bin/local-static-provisioner rc=0
  [[ -x $fence_bin ]] || return 0
  "$fence_bin" fence-node --node "$NODE_NAME" --kubeconfig "$dir/kubelet.kubeconfig" --wait 60s >&2 || rc=$?
  (( rc != 2 )) || fail "the boot fence was refused (see above)"
}

node_ready() {
  [[ $(kubectl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]
}

start_kubelet() {
  launch kubelet "$CONTROL_PLANE_BIN/kubelet" --config "$dir/kubelet.yaml" --kubeconfig "$dir/kubelet.kubeconfig" \
    --hostname-override "$NODE_NAME" --node-ip 127.0.0.1 --root-dir "$KUBELET_ROOT" --cert-dir "$dir/kubelet-pki" -v 2
  wait_for "node $NODE_NAME not Ready" 90 node_ready
  # The node-lifecycle controller is off in the test control plane: nothing else lifts the taint
  # kubelet registers with.
  kubectl taint node "$NODE_NAME" node.kubernetes.io/not-ready:NoSchedule- > /dev/null 2>&1 || true
}
