#!/usr/bin/env bash
# Starts a real Kubernetes control plane on loopback for tests and the local demo:
# etcd, kube-apiserver (RBAC on), kube-controller-manager (PV binder, service accounts and
# tokens; node lifecycle off because no kubelet heartbeats) and kube-scheduler.
#
# Usage: start.sh DIR     DIR is created and holds certificates, kubeconfigs, data, logs/ and
#                         pids; DIR/env is a shell file with KUBECONFIG, API_URL and the binaries.
# LSP_APISERVER_FLAGS: more flags for kube-apiserver, split on spaces (a test of an API server
# configured otherwise, e.g. --feature-gates=WatchList=false as before Kubernetes 1.32).
# Stop it with stop.sh DIR (only the PIDs this script recorded are stopped).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=${1:?usage: start.sh DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
mkdir -p "$dir/logs" "$dir/pki"
: > "$dir/pids"
bin=$(bash "$here/build.sh")

# shellcheck source=tests/lib.sh
source "$here/../lib.sh"
fail() { fail_and_stop "control plane" "$here/stop.sh" "$@"; }

# ---- certificates: a real CA (rustls refuses a leaf used as CA), serving and client certs ----
pki=$dir/pki
ossl() { openssl "$@" >/dev/null 2>&1 || fail "openssl $1 failed"; }
ossl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 3650 \
  -subj "/CN=local-static-provisioner-test-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"

# sign NAME SUBJECT EXTENSIONS
sign() {
  local name=$1 subj=$2 ext=$3
  ossl req -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -out "$pki/$name.csr" -subj "$subj"
  printf '%b' "$ext" > "$pki/$name.ext"
  ossl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -out "$pki/$name.crt" -days 3650 -extfile "$pki/$name.ext"
}
client_ext='basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n'
sign apiserver "/CN=kube-apiserver" \
  'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n'
sign admin "/O=system:masters/CN=kubernetes-admin" "$client_ext"
sign controller-manager "/CN=system:kube-controller-manager" "$client_ext"
sign scheduler "/CN=system:kube-scheduler" "$client_ext"
ossl genrsa -out "$pki/sa.key" 2048
ossl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub"

etcd_port=$(free_port); etcd_peer=$(free_port); api_port=$(free_port)
kcm_port=$(free_port); sched_port=$(free_port)
api_url="https://127.0.0.1:$api_port"

# kubeconfig NAME USER
kubeconfig() {
  local name=$1 user=$2
  cat > "$dir/$name.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: $api_url
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 "$pki/$name.crt")
    client-key-data: $(base64 -w0 "$pki/$name.key")
contexts:
- name: local
  context: {cluster: local, user: $user}
current-context: local
KC
}
kubeconfig admin kubernetes-admin
kubeconfig controller-manager system:kube-controller-manager
kubeconfig scheduler system:kube-scheduler

launch etcd "$bin/etcd" --name default --data-dir "$dir/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "default=http://127.0.0.1:$etcd_peer" --unsafe-no-fsync --log-level warn

# Audit what the agent's ServiceAccount does (metadata only), so the suite can check that its
# ClusterRole is both sufficient and minimal (check-rbac.py).
cat > "$dir/audit-policy.yaml" <<AUDIT
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: ["system:serviceaccount:local-static-provisioner:local-static-provisioner",
          "system:serviceaccount:local-static-provisioner:local-static-provisioner-node-cleanup"]
- level: None
AUDIT

read -ra apiserver_flags <<< "${LSP_APISERVER_FLAGS:-}"
launch kube-apiserver "$bin/kube-apiserver" \
  --audit-policy-file "$dir/audit-policy.yaml" --audit-log-path "$dir/logs/audit.log" \
  --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
  --cert-dir "$dir/apiserver-certs" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" \
  --service-account-issuer "https://kubernetes.default.svc.cluster.local" \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --api-audiences "https://kubernetes.default.svc.cluster.local" \
  --service-cluster-ip-range 10.0.0.0/24 \
  --authorization-mode RBAC --allow-privileged=true --profiling=false \
  --endpoint-reconciler-type none "${apiserver_flags[@]}"

kubectl_admin() { "$bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" "$@"; }

wait_for "kube-apiserver not ready" 90 kubectl_admin get --raw /readyz

launch kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig "$dir/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$dir/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$kcm_port" --cert-dir "$dir/kcm-certs" \
  --leader-elect=false --use-service-account-credentials=true \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
  --controllers '*,-node-lifecycle-controller,-cloud-node-lifecycle-controller' \
  --pvclaimbinder-sync-period 1s

launch kube-scheduler "$bin/kube-scheduler" \
  --kubeconfig "$dir/scheduler.kubeconfig" \
  --authentication-kubeconfig "$dir/scheduler.kubeconfig" \
  --authorization-kubeconfig "$dir/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$sched_port" --cert-dir "$dir/sched-certs" \
  --leader-elect=false

for svc in "kube-controller-manager:$kcm_port" "kube-scheduler:$sched_port"; do
  deadline=$((SECONDS + 60))
  until curl -skf "https://127.0.0.1:${svc#*:}/healthz" >/dev/null 2>&1; do
    (( SECONDS < deadline )) || fail "${svc%%:*} not healthy after 60 s"
    sleep 0.3
  done
done

# Pods need the default ServiceAccount, which the controller-manager creates.
deadline=$((SECONDS + 60))
until kubectl_admin get serviceaccount default -n default >/dev/null 2>&1; do
  (( SECONDS < deadline )) || fail "default ServiceAccount not created after 60 s"
  sleep 0.3
done

cat > "$dir/env" <<ENV
export KUBECONFIG=$dir/admin.kubeconfig
export API_URL=$api_url
export CONTROL_PLANE_BIN=$bin
export CONTROL_PLANE_DIR=$dir
ENV
echo "control plane: ready at $api_url (kubeconfig $dir/admin.kubeconfig, logs $dir/logs)" >&2
