#!/usr/bin/env bash
# Start etcd + kube-apiserver + kube-controller-manager on loopback, in $RM_RUN: v1.20 (Debian's
# source, build-k8s.sh) or the release RM_K8S_VERSION names (e2e/cluster/build.sh, with its etcd).
# Writes $RM_RUN/kubeconfig and one pid file per process; waits for /readyz.
# Ports: RM_ETCD_PORT (23790, +1 for peers), RM_API_PORT (16443), RM_KCM_PORT (10257).
# RM_CONTROL_PLANE_PROFILE: `harness` (default: the process harness's control plane: no
# ServiceAccount admission, no DaemonSet controller, no scheduler) or `cluster` (what a real node
# needs, e2e/cluster/start.sh: Node+RBAC authorization, NodeRestriction and ServiceAccount
# admission, the API server's kubelet client certificate, every controller, kube-scheduler on
# RM_SCHED_PORT). RM_API_ADDRESS (127.0.0.1) is where the API server binds and what it
# advertises (a node reaches it there); RM_SERVICE_CIDR (10.0.0.0/24) the Service range.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
RUN=$RM_RUN
ETCD_PORT=${RM_ETCD_PORT:-23790}; API_PORT=${RM_API_PORT:-16443}; KCM_PORT=${RM_KCM_PORT:-10257}
SCHED_PORT=${RM_SCHED_PORT:-10259}; PROFILE=${RM_CONTROL_PLANE_PROFILE:-harness}
API_ADDR=${RM_API_ADDRESS:-127.0.0.1}; SVC_CIDR=${RM_SERVICE_CIDR:-10.0.0.0/24}; SVC_IP=${SVC_CIDR%.*}.1
case "$PROFILE" in harness|cluster) ;; *) echo "RM_CONTROL_PLANE_PROFILE must be harness or cluster" >&2; exit 1 ;; esac
for b in kube-apiserver kube-controller-manager; do
  [ -x "$RM_K8S_BIN/$b" ] || { echo "missing $RM_K8S_BIN/$b: run e2e/control-plane/build-k8s.sh" >&2; exit 1; }
done
# A module-built release carries the etcd it expects; 1.20 runs Debian's etcd-server.
ETCD=etcd; [ -x "$RM_K8S_BIN/etcd" ] && ETCD=$RM_K8S_BIN/etcd
command -v "$ETCD" >/dev/null || { echo "etcd missing: run e2e/control-plane/install-packages.sh" >&2; exit 1; }
if [ -f "$RUN/apiserver.pid" ] && kill -0 "$(cat "$RUN/apiserver.pid")" 2>/dev/null; then
  echo "a control plane already runs from $RUN (pid $(cat "$RUN/apiserver.pid")); stop it with e2e/control-plane/stop.sh" >&2
  exit 1
fi
rm -rf "$RUN"; mkdir -p "$RUN/pki" "$RUN/etcd-data"
cd "$RUN/pki"
q() { "$@" >/dev/null 2>&1; }
# A throwaway CA, the API server's serving certificate, an admin client certificate and the
# service-account key pair. Valid two days: a test control plane never lives longer.
q openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj "/CN=runner-manager-test-ca"
q openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver"
printf "subjectAltName=IP:127.0.0.1,IP:$API_ADDR,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:$SVC_IP\nextendedKeyUsage=serverAuth\n" > san.ext
q openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 2 -extfile san.ext
q openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=admin"
printf "extendedKeyUsage=clientAuth\n" > client.ext
q openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt -days 2 -extfile client.ext
q openssl genrsa -out sa.key 2048
q openssl rsa -in sa.key -pubout -out sa.pub
cd "$RUN"
"$ETCD" --data-dir "$RUN/etcd-data" --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT+1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT+1))" \
  --initial-cluster "default=http://127.0.0.1:$((ETCD_PORT+1))" > "$RUN/etcd.log" 2>&1 &
echo $! > "$RUN/etcd.pid"
if [ "$PROFILE" = cluster ]; then
  PROFILE_FLAGS=(--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction
    --kubelet-client-certificate pki/admin.crt --kubelet-client-key pki/admin.key
    --kubelet-preferred-address-types InternalIP)
else
  PROFILE_FLAGS=(--authorization-mode RBAC --disable-admission-plugins ServiceAccount)
fi
# Current API servers refuse a loopback advertise address for the `kubernetes` Service's
# endpoints; on loopback nothing in a pod network needs them.
case "$API_ADDR" in 127.*) [ "$RM_K8S_VERSION" = 1.20 ] || PROFILE_FLAGS+=(--endpoint-reconciler-type none) ;; esac
"$RM_K8S_BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address "$API_ADDR" --advertise-address "$API_ADDR" --secure-port "$API_PORT" \
  --tls-cert-file pki/apiserver.crt --tls-private-key-file pki/apiserver.key --client-ca-file pki/ca.crt \
  --service-account-key-file pki/sa.pub --service-account-signing-key-file pki/sa.key \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --api-audiences https://kubernetes.default.svc.cluster.local,runner-manager-broker \
  --service-cluster-ip-range "$SVC_CIDR" "${PROFILE_FLAGS[@]}" --allow-privileged=true \
  > "$RUN/apiserver.log" 2>&1 &
echo $! > "$RUN/apiserver.pid"
cat > "$RUN/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://$API_ADDR:$API_PORT
    certificate-authority: $RUN/pki/ca.crt
users:
- name: admin
  user:
    client-certificate: $RUN/pki/admin.crt
    client-key: $RUN/pki/admin.key
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
KC
ready=
for _ in $(seq 1 120); do
  if curl -sf --cacert pki/ca.crt --cert pki/admin.crt --key pki/admin.key \
       "https://$API_ADDR:$API_PORT/readyz" >/dev/null; then ready=1; break; fi
  kill -0 "$(cat "$RUN/apiserver.pid")" 2>/dev/null || break
  sleep 0.5
done
if [ -z "$ready" ]; then
  echo "kube-apiserver not ready; last lines of $RUN/apiserver.log:" >&2; tail -20 "$RUN/apiserver.log" >&2
  "$here/stop.sh"; exit 1
fi
# The controller manager runs garbage collection (owner references) and namespace deletion.
# No DaemonSet controller: there are no kubelets, and the harness makes each simulated node's
# agent Pod by hand, controlled by a hand-made agent DaemonSet (the broker checks that by uid);
# the controller would delete or disown those pods (e2e/src/harness/node.rs). No pod garbage
# collector either: most simulated nodes (the broker suite's `node-a`) have no Node object, and
# it force-deletes pods bound to a missing node on its next pass once the name has been missing
# for its quarantine, which a name reused by test after test always has (a broker test lost its
# agent pod to it mid-test). Releases after 1.20 have no cloud controllers (route, service,
# cloud-node-lifecycle) in the controller manager.
CONTROLLERS='*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-route,-service,-daemonset,-podgc'
[ "$RM_K8S_VERSION" = 1.20 ] || CONTROLLERS='*,-nodeipam,-nodelifecycle,-daemonset,-podgc'
# 1.20's controller manager also serves an insecure port (10252) unless told not to: two control
# planes on one host would collide there.
KCM_EXTRA=(); [ "$RM_K8S_VERSION" = 1.20 ] && KCM_EXTRA=(--port 0)
# A real node: every controller (node IPAM is off by default; the node's CNI has its own range).
[ "$PROFILE" = cluster ] && CONTROLLERS='*'
"$RM_K8S_BIN/kube-controller-manager" --kubeconfig "$RUN/kubeconfig" --leader-elect=false \
  --service-account-private-key-file pki/sa.key --root-ca-file pki/ca.crt \
  --cluster-signing-cert-file pki/ca.crt --cluster-signing-key-file pki/ca.key \
  --use-service-account-credentials=false \
  --bind-address 127.0.0.1 --secure-port "$KCM_PORT" \
  --controllers "$CONTROLLERS" "${KCM_EXTRA[@]}" > "$RUN/kcm.log" 2>&1 &
echo $! > "$RUN/kcm.pid"
if [ "$PROFILE" = cluster ]; then
  "$RM_K8S_BIN/kube-scheduler" --kubeconfig "$RUN/kubeconfig" --leader-elect=false \
    --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" > "$RUN/scheduler.log" 2>&1 &
  echo $! > "$RUN/scheduler.pid"
fi
echo "control plane ready: KUBECONFIG=$RUN/kubeconfig"
