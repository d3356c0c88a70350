#!/usr/bin/env bash
# Stops the cluster of e2e/cluster/start.sh and undoes what it changed outside $RM_CLUSTER_RUN.
# The node's systemd is stopped by e2e/systemd/stop.sh (its recorded pid only, after checking it
# is that systemd): every process of the node's pid namespace goes with it, containers and shims
# included, and with them its mount namespace (overlays, pod volumes, netns mounts) and its network
# namespace (bridge, pod veths, iptables rules, per-namespace sysctls). The control plane (by pid)
# before it; after it the host end of the veth if it is still there, the host's fallback routes,
# the node's cgroups, the global sysctls.
# Safe to run twice, and after a start that failed half-way. Logs stay in $RM_CLUSTER_RUN/logs.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
[ -d "$RM_CLUSTER_RUN" ] || exit 0
node_up=
[ -s "$NODE_STATE/pid" ] && [ -x "$NODE_STATE/bin/nsexec" ] && node_up=1
# The kubelet first, so that nothing restarts containers while the rest goes down (and the API
# server does not wait on its watches), then the control plane while the node still routes the
# Service addresses it may call webhooks at.
[ -n "$node_up" ] && timeout 20 "$NODE_STATE/bin/nsexec" systemctl stop kubelet.service kube-proxy.service >/dev/null 2>&1
[ -d "$CP_RUN" ] && RM_RUN=$CP_RUN "$here/../control-plane/stop.sh"
if [ -n "$node_up" ]; then
  # Containers whose PID 1 ignores SIGTERM (a shell) would hold systemd's exit for its whole
  # stop timeout: SIGKILL every task first.
  for t in $(timeout 10 "$NODE_STATE/bin/nsexec" ctr -n k8s.io tasks ls -q 2>/dev/null); do
    timeout 5 "$NODE_STATE/bin/nsexec" ctr -n k8s.io tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1
  done
fi
RM_SYSTEMD_STATE=$NODE_STATE RM_SYSTEMD_CGROUP=$RM_CLUSTER_CGROUP "$here/../systemd/stop.sh" >/dev/null
ip link show "$RM_CLUSTER_VETH" >/dev/null 2>&1 && ip link del "$RM_CLUSTER_VETH"
if [ -f "$RM_CLUSTER_RUN/host-routes" ]; then
  while read -r cidr; do ip route del unreachable "$cidr" metric 4242 2>/dev/null; done < "$RM_CLUSTER_RUN/host-routes"
  rm -f "$RM_CLUSTER_RUN/host-routes"
fi
if [ -f "$RM_CLUSTER_RUN/sysctl.before" ]; then
  while IFS='=' read -r k v; do
    [ "$(sysctl -n "$k" 2>/dev/null)" = "$v" ] || sysctl -qw "$k=$v"
  done < "$RM_CLUSTER_RUN/sysctl.before"
  rm -f "$RM_CLUSTER_RUN/sysctl.before"
fi
# The node's filesystem (container layers, pod volumes): nothing is mounted on it any more.
if ! grep -q " $NODE_FS" /proc/mounts; then rm -rf "$NODE_FS"; fi
echo "cluster stopped; logs in $RM_CLUSTER_RUN/logs"
