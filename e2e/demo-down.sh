#!/usr/bin/env bash
# `make demo-down`: stops what `make demo` started — the simulated GitHub (by its recorded pid),
# then the demo's cluster (e2e/cluster/stop.sh: the control plane by pid, the node's systemd with
# every process of the node, runners and containers included, the host veth, routes and sysctls)
# — and what `make demo-processes` started (e2e/demo-processes-down.sh). `--quiet` says nothing
# when there is nothing to stop.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
quiet=false
[ "${1:-}" = --quiet ] && quiet=true
# The demo cluster's settings (e2e/demo.sh).
export RM_K8S_VERSION=${RM_K8S_VERSION:-1.37.2}
export RM_CLUSTER_RUN=${RM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runner-manager}/demo-cluster \
  RM_CLUSTER_NET=10.213.9 RM_CLUSTER_VETH=rmdemo0 RM_CLUSTER_NODE=demo-node \
  RM_CLUSTER_CGROUP=runner-manager-demo-node RM_CLUSTER_POD_CIDR=10.98.9.0/24 \
  RM_CLUSTER_SERVICE_CIDR=10.97.9.0/24 RM_CLUSTER_API_PORT=16763 RM_CLUSTER_ETCD_PORT=24010 \
  RM_CLUSTER_KCM_PORT=10477 RM_CLUSTER_SCHED_PORT=10479
f=$RM_CLUSTER_RUN/demo/fake-github.pid
if [ -f "$f" ]; then
  pid=$(cat "$f")
  # Only the simulated GitHub this demo started: its pid, checked by its executable's name.
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = fake-github ]; then
    kill -TERM "$pid" 2>/dev/null
    $quiet || echo "stopped fake-github (pid $pid)"
  fi
  rm -f "$f"
fi
if [ -d "$RM_CLUSTER_RUN" ]; then
  if $quiet; then "$root/e2e/cluster/stop.sh" >/dev/null 2>&1; else "$root/e2e/cluster/stop.sh"; fi
fi
if $quiet; then "$root/e2e/demo-processes-down.sh" --quiet; else "$root/e2e/demo-processes-down.sh"; fi
