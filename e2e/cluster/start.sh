#!/usr/bin/env bash
# A local Kubernetes cluster with one real node, the way kind builds one, without a registry:
#   1. the node: a pid+mount+uts+cgroup+network namespace booted by Debian's systemd 252 as its
#      PID 1 (e2e/systemd/start.sh), with its own /var (bound from $RM_CLUSTER_RUN/node-fs/var),
#      its own /run, `/` shared for mount propagation (hostPath mountPropagation), the v1
#      hierarchies the kubelet needs (cpuset included) and a veth pair to the host:
#      host end $RM_CLUSTER_NET.1, node end $RM_CLUSTER_NET.2 (the node IP, off loopback);
#   2. the control plane on the host (e2e/control-plane/start.sh, profile `cluster`), bound to
#      the host end, so the node and its pods reach it there and through the `kubernetes` Service;
#   3. containerd (Debian's, with runc and the CNI bridge), the kubelet and kube-proxy (iptables
#      mode) as systemd units of the node; the images of $RM_IMAGES imported into its containerd
#      (by name and by digest reference), never pulled: the node has no route but to the host;
#   4. the cluster DNS (CoreDNS, e2e/cluster/dns.sh) behind the kube-dns Service at $DNS_IP.
# A hostPID pod of that node sees the node's systemd as PID 1 and, through a hostPath, its
# /run/systemd: what the node agent's systemd launcher talks to on a real machine.
#
# Writes $RM_CLUSTER_RUN/kubeconfig. Everything it changes outside $RM_CLUSTER_RUN is undone by
# e2e/cluster/stop.sh, which runs on every failed exit here: the host veth (the node's own
# network namespace holds the bridge, pod veths, iptables rules and per-namespace sysctls and
# goes with the node), the node's cgroup in each hierarchy, the global sysctls the node changes
# (saved to $RM_CLUSTER_RUN/sysctl.before), the processes (all inside the node's pid namespace).
# Needs RM_K8S_VERSION of a module-built release (e2e/cluster/build.sh), and root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
t0=$(date +%s%N)
say() { local ms=$(( ($(date +%s%N) - t0) / 1000000 )); printf 'cluster/start.sh [%d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*"; }
die() { echo "cluster/start.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root"
[ "$RM_K8S_VERSION" != 1.20 ] || die "the node needs a module-built release: RM_K8S_VERSION=1.37.2 (e2e/cluster/build.sh)"
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy etcd; do
  [ -x "$RM_K8S_BIN/$b" ] || die "missing $RM_K8S_BIN/$b: run e2e/cluster/build.sh"
done
for b in containerd ctr runc iptables ip nsenter openssl curl; do
  command -v "$b" >/dev/null || die "missing $b: run e2e/cluster/install-packages.sh"
done
if [ -s "$NODE_STATE/pid" ] && kill -0 "$(cat "$NODE_STATE/pid")" 2>/dev/null; then
  die "a node already runs from $RM_CLUSTER_RUN; stop it with e2e/cluster/stop.sh"
fi
# Leftovers of a run that died without its stop: clean them first.
"$here/stop.sh" >/dev/null 2>&1 || true
ok=
trap '[ -n "$ok" ] || { echo "cluster/start.sh: failed; stopping what was started" >&2; "$here/stop.sh" >&2; }' EXIT
rm -rf "$RM_CLUSTER_RUN"
CFG=$RM_CLUSTER_RUN/config LOGS=$RM_CLUSTER_RUN/logs
mkdir -p "$CFG/cni" "$LOGS" "$NODE_FS/var"
# The node's /var as a Debian host has it: the runner accounts search /var/lib on their way to
# their runtimes under the agent's host root (a /var/lib that containerd or the kubelet made
# first is 0700, and every runner failed 200/CHDIR).
install -d -m 0755 "$NODE_FS/var/lib" "$NODE_FS/var/log" "$NODE_FS/var/cache"
install -d -m 1777 "$NODE_FS/var/tmp" "$NODE_FS/tmp"
for k in $CLUSTER_SYSCTLS; do v=$(sysctl -n "$k" 2>/dev/null) && echo "$k=$v"; done > "$RM_CLUSTER_RUN/sysctl.before"

"$here/images.sh" >/dev/null
say "images ready"

# --- 1. the node namespace, booted by systemd
cat > "$CFG/preinit.sh" <<EOF
# Sourced inside the node's mount namespace before its systemd starts (e2e/systemd/start.sh).
# Mount propagation as on a booted host (systemd does this itself only outside a container).
mount --make-rshared /
# The node's own /var: /var/lib/kubelet, /var/lib/containerd, /var/log/pods, the agent's host root.
mount --bind "$NODE_FS/var" /var
# The node's own /tmp, as a real node has: the checks search it for leaked JIT handoff files, and
# the host's /tmp holds the tests that run beside the node (a CI run failed on one of their
# jit-*.tmp files, gone a moment later).
mount --bind "$NODE_FS/tmp" /tmp
EOF
RM_SYSTEMD_STATE=$NODE_STATE RM_SYSTEMD_CGROUP=$RM_CLUSTER_CGROUP \
RM_SYSTEMD_HIERARCHIES="systemd unified memory cpu cpuacct cpuset pids blkio devices freezer" \
RM_SYSTEMD_NETNS=1 RM_SYSTEMD_PROC_SYS=rw RM_SYSTEMD_PREINIT="$CFG/preinit.sh" \
  "$here/../systemd/start.sh" >/dev/null
NSPID=$(cat "$NODE_STATE/pid")
N() { "$NODE_STATE/bin/nsexec" "$@"; }
ip link add "$RM_CLUSTER_VETH" type veth peer name eth0 netns "$NSPID"
ip addr add "$HOST_IP/30" dev "$RM_CLUSTER_VETH"
ip link set "$RM_CLUSTER_VETH" up
N ip link set lo up
N ip addr add "$NODE_IP/30" dev eth0
N ip link set eth0 up
# No default route: the node and its pods reach the host's end of the veth (the API server, the
# simulated GitHub) and nothing else, so a pull that should never happen fails at once.
N sysctl -qw net.ipv4.ip_forward=1
# The host reaches Services and pods through the node, as a cluster's own hosts do: the API server
# calls admission webhooks at their Service's ClusterIP. Without these routes that traffic would
# follow the host's default route off the machine: an `unreachable` route of lower priority
# stands behind each (removed by stop.sh after the control plane), for when the node is gone.
for cidr in "$RM_CLUSTER_SERVICE_CIDR" "$RM_CLUSTER_POD_CIDR"; do
  ip route add unreachable "$cidr" metric 4242
  echo "$cidr" >> "$RM_CLUSTER_RUN/host-routes"
  ip route add "$cidr" via "$NODE_IP" dev "$RM_CLUSTER_VETH"
done
say "node namespace up: systemd pid $NSPID, node IP $NODE_IP"

# --- 2. the control plane, bound to the host end of the veth
RM_RUN=$CP_RUN RM_CONTROL_PLANE_PROFILE=cluster RM_API_ADDRESS=$HOST_IP \
RM_API_PORT=$RM_CLUSTER_API_PORT RM_ETCD_PORT=$RM_CLUSTER_ETCD_PORT RM_KCM_PORT=$RM_CLUSTER_KCM_PORT \
RM_SCHED_PORT=$RM_CLUSTER_SCHED_PORT RM_SERVICE_CIDR=$RM_CLUSTER_SERVICE_CIDR \
  "$here/../control-plane/start.sh" >/dev/null
cp "$CP_RUN/kubeconfig" "$RM_CLUSTER_RUN/kubeconfig"
K() { "$RM_TOOLS_BIN/kubectl" --kubeconfig "$RM_CLUSTER_RUN/kubeconfig" "$@"; }
say "control plane ready on $HOST_IP:$RM_CLUSTER_API_PORT"

# The node's credentials: the kubelet as system:node:<name> (Node authorizer, NodeRestriction),
# kube-proxy as system:kube-proxy (bound to system:node-proxier by the bootstrap policy).
PKI=$CP_RUN/pki
cert() { # name subject
  openssl req -newkey rsa:2048 -nodes -keyout "$PKI/$1.key" -out "$PKI/$1.csr" -subj "$2" >/dev/null 2>&1
  printf 'extendedKeyUsage=clientAuth\n' > "$PKI/$1.ext"
  openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -out "$PKI/$1.crt" -days 2 -extfile "$PKI/$1.ext" >/dev/null 2>&1
  cat > "$CFG/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://$HOST_IP:$RM_CLUSTER_API_PORT", certificate-authority: $PKI/ca.crt}
users:
- name: $1
  user: {client-certificate: $PKI/$1.crt, client-key: $PKI/$1.key}
contexts:
- name: local
  context: {cluster: local, user: $1}
current-context: local
EOF
}
cert kubelet "/O=system:nodes/CN=system:node:$RM_CLUSTER_NODE"
cert kube-proxy "/CN=system:kube-proxy"

# --- 3. containerd, the kubelet and kube-proxy as units of the node's systemd
cat > "$CFG/containerd.toml" <<EOF
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$(sed -n 1p "$RM_IMAGES/pause.ref")"
  stream_server_address = "127.0.0.1"
  # No CAP_SYS_RESOURCE here, even for root: runc cannot write the negative oom_score_adj CRI
  # gives sandboxes ("can't get final child's PID from pipe: EOF"); clamp to containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$CFG/cni"
EOF
cat > "$CFG/cni/10-bridge.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "rm-node",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$RM_CLUSTER_POD_CIDR"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
cat > "$CFG/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
# This host has cgroup v1 controllers (v2 mounted without any): allowed explicitly since 1.35.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: true
enforceNodeAllocatable: []
failSwapOn: false
# The API server authenticates with its CA-signed client certificate.
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: AlwaysAllow}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
clusterDomain: cluster.local
# The cluster DNS (e2e/cluster/dns.sh): pods resolve <service>.<namespace>.svc through it.
clusterDNS: [$DNS_IP]
resolvConf: /etc/resolv.conf
serializeImagePulls: false
# No registry: an image that image GC removed could never come back.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%, nodefs.inodesFree: 2%}
EOF
cat > "$CFG/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $CFG/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $RM_CLUSTER_POD_CIDR
hostnameOverride: $RM_CLUSTER_NODE
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# conntrack limits are host-global: left alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
U=$NODE_STATE/units
cat > "$U/containerd.service" <<EOF
[Unit]
Description=containerd (runner-manager e2e node)
[Service]
ExecStart=/usr/bin/containerd --config $CFG/containerd.toml
Delegate=yes
KillMode=process
Restart=always
RestartSec=1
TasksMax=infinity
StandardOutput=append:$LOGS/containerd.log
StandardError=inherit
EOF
cat > "$U/kubelet.service" <<EOF
[Unit]
Description=kubelet (runner-manager e2e node)
After=containerd.service
Wants=containerd.service
[Service]
ExecStart=$RM_K8S_BIN/kubelet --config $CFG/kubelet.yaml --kubeconfig $CFG/kubelet.kubeconfig \\
  --hostname-override $RM_CLUSTER_NODE --node-ip $NODE_IP --v=${RM_CLUSTER_KUBELET_V:-1}
Restart=always
RestartSec=1
StandardOutput=append:$LOGS/kubelet.log
StandardError=inherit
EOF
cat > "$U/kube-proxy.service" <<EOF
[Unit]
Description=kube-proxy (runner-manager e2e node)
[Service]
ExecStart=$RM_K8S_BIN/kube-proxy --config $CFG/kube-proxy.yaml
Restart=always
RestartSec=1
StandardOutput=append:$LOGS/kube-proxy.log
StandardError=inherit
EOF
N systemctl daemon-reload
N systemctl start containerd.service
CTR() { N ctr -n k8s.io "$@"; }
for _ in $(seq 1 80); do CTR version >/dev/null 2>&1 && break; sleep 0.25; done
CTR version >/dev/null 2>&1 || { tail -20 "$LOGS/containerd.log" >&2; die "containerd did not start"; }
# Each image by its name and by its digest reference (NAME@sha256:..., what the chart uses).
"$here/load-images.sh" >/dev/null
say "containerd up; images imported: $(cd "$RM_IMAGES" && ls ./*.tar | sed 's#^\./##; s#\.tar$##' | tr '\n' ' ')"
N systemctl start kubelet.service
ready=
for _ in $(seq 1 240); do
  [ "$(K get node "$RM_CLUSTER_NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] \
    && { ready=1; break; }
  sleep 0.5
done
[ -n "$ready" ] || { grep -E '^[EF]' "$LOGS/kubelet.log" | tail -20 >&2; die "node $RM_CLUSTER_NODE not Ready"; }
say "node $RM_CLUSTER_NODE Ready ($NODE_IP, kubelet $("$RM_K8S_BIN/kubelet" --version | cut -d' ' -f2))"
N systemctl start kube-proxy.service
for _ in $(seq 1 60); do N curl -sf http://127.0.0.1:10256/healthz >/dev/null 2>&1 && break; sleep 0.5; done
N curl -sf http://127.0.0.1:10256/healthz >/dev/null 2>&1 || { tail -20 "$LOGS/kube-proxy.log" >&2; die "kube-proxy not healthy"; }
say "kube-proxy up"
KUBECONFIG=$RM_CLUSTER_RUN/kubeconfig "$here/dns.sh"
say "cluster DNS (CoreDNS) answers at $DNS_IP"
ok=1
echo "cluster ready: KUBECONFIG=$RM_CLUSTER_RUN/kubeconfig (node shell: $NODE_STATE/bin/nsexec bash)"
