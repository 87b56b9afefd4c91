#!/usr/bin/env bash
# Benchmark (not a test): what per-volume encryption (a class's `encryption: fscrypt`,
# docs/encryption.md) costs beside the same volumes unencrypted. N ext4 loop volumes made with
# the encrypt feature (default 20) in each of two classes, one plain and one encrypting, all
# present when the agent starts: time until each class's N PVs exist. Then one volume of each
# class gets FILES files (default 2000, 4 KiB each) through its PV's path, its claim is
# released, and the time until the PV is Available again is taken (the encrypted one destroys
# its key first: a crypto-erase, then the same removal of the files). Needs root. Prints JSON
# lines and a table.
n=${1:-20}
files=${FILES:-2000}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
loops=()
enc_cleanup() {
  for d in "$work"/plain/* "$work"/enc/*; do mountpoint -q "$d" && umount "$d"; done
  for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null || true; done
}
trap 'enc_cleanup; bench_cleanup' EXIT
for class in bench-plain bench-enc; do
  k apply -f - > /dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $class}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
YAML
done
mkdir -p "$work/plain" "$work/enc" "$work/images"
printf 'bench-plain:\n  hostDir: %s\n  mountDir: %s\nbench-enc:\n  hostDir: %s\n  mountDir: %s\n  encryption: fscrypt\n' \
  "$work/plain" "$work/plain" "$work/enc" "$work/enc" > "$work/config/storageClassMap"
for kind in plain enc; do
  for i in $(seq 1 "$n"); do
    img=$work/images/$kind-$i.img
    truncate -s 32M "$img"
    dev=$(losetup --find --show "$img")
    loops+=("$dev")
    mkfs.ext4 -q -F -O encrypt "$dev"
    mkdir -p "$work/$kind/v$i"
    mount "$dev" "$work/$kind/v$i"
  done
done
count() { k get pv -o jsonpath="{range .items[?(@.spec.storageClassName==\"$1\")]}{.metadata.name}{\"\\n\"}{end}" | grep -c . || true; }
start=$(now)
start_agent
plain_s="" enc_s=""
while [[ -z $plain_s || -z $enc_s ]]; do
  [[ -z $plain_s && $(count bench-plain) -ge $n ]] && plain_s=$(elapsed "$start" "$(now)")
  [[ -z $enc_s && $(count bench-enc) -ge $n ]] && enc_s=$(elapsed "$start" "$(now)")
  sleep 0.05
done
echo "{\"figure\":\"encryption_publish\",\"volumes_per_class\":$n,\"plain_seconds\":$plain_s,\"encrypted_seconds\":$enc_s}"

# One volume of each class: bound, filled through its PV's path, released; time until back.
recycle() {
  local class=$1 root=$2 pv path uid
  pv=$(k get pv -o jsonpath="{range .items[?(@.spec.local.path==\"$root\")]}{.metadata.name}{end}")
  [[ -n $pv ]] || pv=$(k get pv -o jsonpath="{range .items[?(@.spec.local.path==\"$root/lsp-encrypted\")]}{.metadata.name}{end}")
  path=$(k get pv "$pv" -o jsonpath='{.spec.local.path}')
  k apply -f - > /dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: bench-$class, namespace: default}
spec: {accessModes: [ReadWriteOnce], storageClassName: $class, volumeName: $pv, resources: {requests: {storage: 1Mi}}}
YAML
  until [[ $(k get pv "$pv" -o jsonpath='{.status.phase}') == Bound ]]; do sleep 0.1; done
  python3 - "$path" "$files" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, f"d{i // 100}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i}"), "wb") as f:
        f.write(os.urandom(4096))
PY
  sync
  uid=$(k get pv "$pv" -o jsonpath='{.metadata.uid}')
  local t0 state
  t0=$(now)
  k delete pvc "bench-$class" --wait=false > /dev/null
  while :; do
    state=$(k get pv "$pv" -o jsonpath='{.metadata.uid} {.status.phase}' 2>/dev/null || true)
    [[ "$state" != "$uid "* && "$state" == *" Available" ]] && break
    sleep 0.05
  done
  local secs method
  secs=$(elapsed "$t0" "$(now)")
  method=$(k get pv "$pv" -o jsonpath='{.metadata.annotations.local-static-provisioner\.io/last-wipe}' | grep -o 'method=[^ ]*' || true)
  echo "{\"figure\":\"encryption_recycle\",\"class\":\"$class\",\"files\":$files,\"seconds\":$secs,\"last_wipe\":\"$method\"}"
}
plain_line=$(recycle bench-plain "$work/plain/v1")
enc_line=$(recycle bench-enc "$work/enc/v1")
echo "$plain_line"
echo "$enc_line"
python3 - "$n" "$plain_s" "$enc_s" "$plain_line" "$enc_line" <<'PY'
import json, sys
n, plain_s, enc_s = sys.argv[1], sys.argv[2], sys.argv[3]
p, e = json.loads(sys.argv[4]), json.loads(sys.argv[5])
rows = [
    ("figure", "plain", "encrypted"),
    (f"{n} volumes published (s)", plain_s, enc_s),
    (f"released volume with {p['files']} files back (s)", str(p["seconds"]), str(e["seconds"])),
    ("wipe method", p["last_wipe"], e["last_wipe"]),
]
w = [max(len(r[i]) for r in rows) for i in range(3)]
for r in rows:
    print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
PY
