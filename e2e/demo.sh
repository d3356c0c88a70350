#!/usr/bin/env bash
# `make demo`: the product as users run it, on this machine.
#
# A local Kubernetes cluster with one real node (e2e/cluster/start.sh: the control plane of a
# current release built from its Go modules, a node booted by systemd running containerd, the
# kubelet, kube-proxy and CoreDNS), the project's images imported into the node (no registry),
# `helm install` of the chart, the simulated GitHub where the node's pods reach it, a ScalePolicy,
# a handful of jobs, and `kubectl get sp,ra` as the RunnerAttempts go Pending → … → Idle → Busy →
# Cleaned. Each runner is a transient unit of the node's systemd (`make demo` prints how to see
# them).
#
# Everything keeps running afterwards (`make demo-down` stops it); `--stop` (`make demo
# DEMO_ARGS=--stop`) stops it at the end. `DEMO_MODE=processes` (or `make demo-processes`) runs
# the process-based loop instead (e2e/demo-processes.sh: two simulated nodes, no kubelet).
# Needs root (the node is a set of namespaces), Go for the first Kubernetes build (~12 min, cached).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [ "${DEMO_MODE:-cluster}" = processes ]; then exec e2e/demo-processes.sh "$@"; fi
stop_at_end=false
jobs=${DEMO_JOBS:-6}
for a in "$@"; do
  case "$a" in
    --stop) stop_at_end=true ;;
    --jobs=*) jobs=${a#--jobs=} ;;
    *) echo "demo.sh: unknown option $a (known: --stop, --jobs=N)" >&2; exit 2 ;;
  esac
done

export RM_K8S_VERSION=${RM_K8S_VERSION:-1.37.2}
# The demo's cluster: its own run directory, addresses, veth and cgroup (e2e/cluster/env.sh), so
# that `make test`'s cluster and one started by hand are left alone.
export RM_CLUSTER_RUN=${RM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runner-manager}/demo-cluster \
  RM_CLUSTER_NET=10.213.9 RM_CLUSTER_VETH=rmdemo0 RM_CLUSTER_NODE=demo-node \
  RM_CLUSTER_CGROUP=runner-manager-demo-node RM_CLUSTER_POD_CIDR=10.98.9.0/24 \
  RM_CLUSTER_SERVICE_CIDR=10.97.9.0/24 RM_CLUSTER_API_PORT=16763 RM_CLUSTER_ETCD_PORT=24010 \
  RM_CLUSTER_KCM_PORT=10477 RM_CLUSTER_SCHED_PORT=10479
. e2e/cluster/env.sh
. e2e/cluster/product.sh
K() { "$RM_TOOLS_BIN/kubectl" "$@"; }
H() { "$RM_TOOLS_BIN/helm" "$@"; }
t_start=$(date +%s)
say() { printf '\n\033[1m[%ss] %s\033[0m\n' "$(( $(date +%s) - t_start ))" "$*"; }
run() { printf '\033[2m$ %s\033[0m\n' "$*"; "$@"; }

say "1/6 set-up: Debian packages, Kubernetes $RM_K8S_VERSION (built once, cached), kubectl and helm, runner accounts, the binaries and images"
e2e/cluster/install-packages.sh >/dev/null
e2e/cluster/build.sh
e2e/control-plane/install-tools.sh >/dev/null
e2e/setup-runner-accounts.sh >/dev/null
cargo build --workspace --bins
e2e/images/build.sh

say "2/6 the cluster: control plane, a node booted by systemd (containerd, kubelet, kube-proxy, CoreDNS)"
e2e/demo-down.sh --quiet || true
e2e/cluster/start.sh
export KUBECONFIG=$RM_CLUSTER_RUN/kubeconfig
work=$RM_CLUSTER_RUN/demo
mkdir -p "$work"

say "3/6 the simulated GitHub at the host end of the node's veth ($HOST_IP)"
start_fake_github "$work"
github_app "$work"
echo "simulated GitHub at $gh (a GitHub App, id 4242, installed on acme)"

say "4/6 helm install (images by digest, the chart's values for a test GitHub)"
ns=runner-manager-system
op=$(sed -n 2p "$RM_IMAGES/operator.ref") ag=$(sed -n 2p "$RM_IMAGES/node-agent.ref")
chart_values
printf '\033[2m$ helm install runner-manager charts/runner-manager -n %s --set image.operator.digest=%s --set image.nodeAgent.digest=%s %s\033[0m\n' \
  "$ns" "${op#*@}" "${ag#*@}" "${values[*]}"
install_product runner-manager $ns
run kubectl get pods -A -o wide

say "5/6 a ScalePolicy (minIdle 1, maxRunners 4), then $jobs jobs queued on acme/web"
apply_policy demo web 1 4 "$work/app.pem"
run kubectl get scalepolicy -n demo web -o yaml | sed -n '/^spec:/,/^status:/p' | sed '$d'
started=$(date +%s)
job_ids=()
for i in $(seq 1 "$jobs"); do job_ids+=("$(queue_job "build-$i" 3000)"); done
echo "queued jobs: ${job_ids[*]}"

say "6/6 watching (kubectl get sp,ra -n demo) until every job has completed"
deadline=$((started + ${DEMO_TIMEOUT:-240}))
while :; do
  done_count=0
  for id in "${job_ids[@]}"; do
    [ "$(admin GET "jobs/$id" | jq -r .status)" = completed ] && done_count=$((done_count + 1))
  done
  printf '\n\033[1m-- %ss: %s/%s jobs completed --\033[0m\n' "$(( $(date +%s) - started ))" "$done_count" "$jobs"
  K get sp,ra -n demo 2>&1 | sed 's/^/  /'
  echo "  runner units in the node's systemd: $("$NODE_STATE/bin/nsexec" systemctl list-units --plain --no-legend 'rm-*.service' | awk '{print $1}' | tr '\n' ' ')"
  [ "$done_count" -eq "$jobs" ] && break
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "not every job completed within ${DEMO_TIMEOUT:-240}s; see kubectl logs -n $ns ds/runner-manager-node-agent" >&2
    break
  fi
  sleep 2
done

say "summary"
K get ra -n demo -o json | jq -r -f "$root/e2e/demo-summary.jq"
echo "jobs completed: $done_count/$jobs in $(( $(date +%s) - started ))s; make demo took $(( $(date +%s) - t_start ))s"
echo "runners registered on the simulated GitHub: $(admin GET runners | jq 'length') (the idle one minIdle keeps)"

if $stop_at_end; then
  e2e/demo-down.sh
else
  cat <<MSG

Everything keeps running:
  export KUBECONFIG=$KUBECONFIG
  kubectl get sp,ra -n demo -w
  kubectl logs -n $ns ds/runner-manager-node-agent -f
  $NODE_STATE/bin/nsexec systemctl list-units 'rm-*'     # the runners, as units of the node's systemd
  simulated GitHub: $gh   (queue a job: see e2e/cluster/product.sh, queue_job)
Stop it all with: make demo-down
MSG
fi
