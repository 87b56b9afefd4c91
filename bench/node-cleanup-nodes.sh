#!/usr/bin/env bash
# Benchmark (not a test): node-cleanup's idle cost against the number of Nodes. For each count
# in NODE_COUNTS (default "10 2000"), that many Nodes exist (created through the API, with the
# labels and annotations a kubelet gives them), and one node-cleanup replica (its own RBAC,
# default resync and lease timings) is started afresh, left 15 s to lead and sync, then watched
# for IDLE_SECONDS (default 60): its API requests per minute (the API server's audit log, by
# its ServiceAccount, one per audit ID) with the Node requests apart, and its resident memory
# now and at peak (VmHWM). Flat: neither grows with the number of Nodes. There are no kubelets,
# so no Node status updates: on a real cluster those reach node-cleanup as watch events (not
# requests). Needs root (shared set-up). Prints JSON lines and a table.
counts=${NODE_COUNTS:-10 2000}
idle=${IDLE_SECONDS:-60}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bash "$repo/tests/control-plane/agent-kubeconfig.sh" "$work/cp" "$work/nc.kubeconfig" node-cleanup
audit=$work/cp/logs/audit.log
user=system:serviceaccount:local-static-provisioner:local-static-provisioner-node-cleanup

# make_nodes FROM TO: Nodes bench-n-FROM..TO-1, created in Lists of 500.
make_nodes() {
  python3 - "$1" "$2" <<'PY' | while read -r chunk; do echo "$chunk" | k create -f - > /dev/null; done
import json, sys
lo, hi = int(sys.argv[1]), int(sys.argv[2])
def node(i):
    name = f"bench-n-{i}"
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "m5.2xlarge", "topology.kubernetes.io/region": "eu-west-1",
        "topology.kubernetes.io/zone": f"eu-west-1{'abc'[i % 3]}", "node-role.kubernetes.io/worker": ""},
        "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                        "csi.volume.kubernetes.io/nodeid": json.dumps({"ebs.csi.aws.com": f"i-{i:017x}"})}}}
for start in range(lo, hi, 500):
    print(json.dumps({"apiVersion": "v1", "kind": "List", "items": [node(i) for i in range(start, min(hi, start + 500))]}))
PY
}

# measure N: a fresh node-cleanup with N Nodes present; prints one JSON line.
measure() {
  RUST_LOG=warn "$bin" node-cleanup --storage-classes fast-disks --listen-address 127.0.0.1:0 \
    --kubeconfig "$work/nc.kubeconfig" --lease-name "bench-nodes-$1" 2> "$work/nc-$1.log" &
  agent_pid=$!
  sleep 15
  local from t0
  from=$(wc -l < "$audit")
  t0=$(now)
  sleep "$idle"
  local rss hwm anon
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$agent_pid/status")
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$agent_pid/status")
  anon=$(awk '/RssAnon/ {print $2}' "/proc/$agent_pid/status")
  local secs
  secs=$(elapsed "$t0" "$(now)")
  kill "$agent_pid" && wait "$agent_pid" || true
  agent_pid=""
  python3 - "$audit" "$from" "$user" "$1" "$secs" "$rss" "$hwm" "$anon" <<'PY'
import json, sys
path, start, user, nodes, secs, rss, hwm, anon = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
secs = float(secs)
seen, node_requests = set(), 0
with open(path) as f:
    for n, line in enumerate(f):
        if n < start:
            continue
        ev = json.loads(line)
        if ev.get("user", {}).get("username") != user or ev["auditID"] in seen:
            continue
        seen.add(ev["auditID"])
        node_requests += (ev.get("objectRef") or {}).get("resource") == "nodes"
per_min = lambda n: round(n * 60 / secs, 1)
print(json.dumps({"figure": "node_cleanup_idle", "nodes": int(nodes), "seconds": round(secs, 1),
                  "requests_per_min": per_min(len(seen)), "node_requests_per_min": per_min(node_requests),
                  "rss_kib": int(rss), "rss_anon_kib": int(anon), "vmhwm_kib": int(hwm)}))
PY
}

present=1 # bench-node, from lib.sh
results=()
for n in $counts; do
  (( n > present )) && make_nodes "$present" "$n" && present=$n
  results+=("$(measure "$n")")
done
printf '%s\n' "${results[@]}"
python3 - "${results[@]}" <<'PY'
import json, sys
rows = [json.loads(a) for a in sys.argv[1:]]
print(f"{'nodes':>7} {'requests/min':>13} {'node_requests/min':>18} {'rss_MiB':>8} {'anon_MiB':>9} {'peak_MiB':>9}")
for r in rows:
    print(f"{r['nodes']:>7} {r['requests_per_min']:>13} {r['node_requests_per_min']:>18} "
          f"{r['rss_kib'] / 1024:>8.1f} {r['rss_anon_kib'] / 1024:>9.1f} {r['vmhwm_kib'] / 1024:>9.1f}")
PY
