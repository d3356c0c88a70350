# Sourced by e2e/cluster/{start,stop,images}.sh: one local cluster with a real node.
# The node is booted the way kind boots one: a namespace (pid, mount, uts, cgroup, network) whose
# PID 1 is Debian's systemd (e2e/systemd/start.sh), running containerd, the kubelet and kube-proxy
# as its units, with its own /var and /run; the control plane runs on the host, bound to the
# host end of the node's veth.
here_cluster=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here_cluster/../control-plane/env.sh"
: "${RM_CLUSTER_RUN:=$RM_CACHE/cluster}"
: "${RM_IMAGES:=$RM_CACHE/images}"
# The node's network: a /30 on a veth pair, host end .1 (API server), node end .2 (node IP).
: "${RM_CLUSTER_NET:=10.213.7}"
: "${RM_CLUSTER_VETH:=rmnode0}"
: "${RM_CLUSTER_NODE:=rm-node}"
: "${RM_CLUSTER_CGROUP:=runner-manager-e2e-node}"
# Pods and Services exist only inside the node's network namespace.
: "${RM_CLUSTER_POD_CIDR:=10.98.0.0/24}"
: "${RM_CLUSTER_SERVICE_CIDR:=10.97.0.0/24}"
: "${RM_CLUSTER_API_PORT:=16743}"
: "${RM_CLUSTER_ETCD_PORT:=23990}"
: "${RM_CLUSTER_KCM_PORT:=10457}"
: "${RM_CLUSTER_SCHED_PORT:=10459}"
HOST_IP=$RM_CLUSTER_NET.1
# The cluster DNS Service's address (e2e/cluster/dns.sh), in every pod's resolv.conf (kubelet clusterDNS).
DNS_IP=${RM_CLUSTER_SERVICE_CIDR%.*}.10
NODE_IP=$RM_CLUSTER_NET.2
CP_RUN=$RM_CLUSTER_RUN/control-plane
NODE_STATE=$RM_CLUSTER_RUN/node
NODE_FS=$RM_CLUSTER_RUN/node-fs
export RM_IMAGES RM_CLUSTER_RUN RM_CLUSTER_NET RM_CLUSTER_VETH RM_CLUSTER_NODE RM_CLUSTER_CGROUP
# Host-global sysctls the node changes (the kubelet: overcommit, panic, keys; its systemd as PID 1:
# fs.file-max, fs.nr_open): saved by start.sh, restored by stop.sh. Per-network-namespace ones
# (ip_forward, route_localnet, ...) are the node's own and go with it.
CLUSTER_SYSCTLS="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes fs.file-max fs.nr_open"
