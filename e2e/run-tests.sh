#!/usr/bin/env bash
# `make test`: everything, in the order that fails fastest, with the control plane it starts
# stopped by pid on every exit path. Prints the wall time of each stage.
# RM_K8S_VERSION: the Kubernetes release the suite runs on, 1.37.2 by default (every component
# built from its Go module, e2e/cluster/build.sh), or 1.20 (Debian's source, no node stage).
# RM_TEST_NODE=0 skips the real node stage (a cluster with one node booted by systemd, the
# project's images, `helm install` on it and jobs on runners that are units of the node's
# systemd); `e2e/run-tests.sh --node-only` runs that stage alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export RM_K8S_VERSION=${RM_K8S_VERSION:-1.37.2}
. e2e/control-plane/env.sh
# Its own run directory and ports, so a running `make demo` is left alone.
export RM_RUN="$RM_CACHE/test-run" RM_API_PORT=${RM_TEST_API_PORT:-16543} \
  RM_ETCD_PORT=${RM_TEST_ETCD_PORT:-23890} RM_KCM_PORT=${RM_TEST_KCM_PORT:-10357}

stage() { printf '\n=== %s\n' "$*"; SECONDS_STAGE=$SECONDS; }
done_stage() { printf -- '--- %s: %ss\n' "$1" $((SECONDS - SECONDS_STAGE)); }
# The real node's cluster: its own run directory, ports, veth, addresses and cgroup, so that a
# cluster started by hand (e2e/cluster/start.sh defaults) is left alone.
export RM_CLUSTER_RUN="$RM_CACHE/test-cluster" RM_CLUSTER_NET=10.213.8 RM_CLUSTER_VETH=rmtest0 \
  RM_CLUSTER_NODE=rm-test-node RM_CLUSTER_CGROUP=runner-manager-e2e-test-node \
  RM_CLUSTER_POD_CIDR=10.98.8.0/24 RM_CLUSTER_SERVICE_CIDR=10.97.8.0/24 RM_CLUSTER_API_PORT=16753 \
  RM_CLUSTER_ETCD_PORT=24000 RM_CLUSTER_KCM_PORT=10467 RM_CLUSTER_SCHED_PORT=10469
cleanup() { e2e/cluster/stop.sh >/dev/null; e2e/systemd/stop.sh; e2e/control-plane/stop.sh; }
trap cleanup EXIT

node_stage() {
  stage "a real node: images, cluster, pods, helm install, jobs on the node's systemd, runner and placeholder pods (RM_TEST_NODE=0 skips)"
  e2e/cluster/install-packages.sh
  e2e/cluster/build.sh
  cargo build --workspace --bins
  e2e/images/build.sh
  e2e/cluster/start.sh
  KUBECONFIG="$RM_CLUSTER_RUN/kubeconfig" e2e/cluster/check.sh
  KUBECONFIG="$RM_CLUSTER_RUN/kubeconfig" e2e/cluster/helm-check.sh
  # Runner pods (execution.mode: Oci) and placeholder pods on the real node (issue 16).
  KUBECONFIG="$RM_CLUSTER_RUN/kubeconfig" e2e/cluster/pods-check.sh
  KUBECONFIG="$RM_CLUSTER_RUN/kubeconfig" e2e/cluster/outage-check.sh
  e2e/cluster/stop.sh
  done_stage node
}
if [ "${1:-}" = --node-only ]; then
  [ "$RM_K8S_VERSION" != 1.20 ] || { echo "run-tests.sh: the node stage needs RM_K8S_VERSION >= 1.37" >&2; exit 2; }
  # Only the node's cluster is started here: leave the suite's control plane and systemd alone.
  trap 'e2e/cluster/stop.sh >/dev/null' EXIT
  e2e/control-plane/install-tools.sh
  node_stage
  echo
  echo "make test (node stage only): green in ${SECONDS}s"
  exit 0
fi

stage "install: Debian packages, kubectl, helm"
e2e/control-plane/install-tools.sh
done_stage install

stage "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
done_stage lints

stage "generated CRDs are fresh (crds/generated and the chart's copy)"
diff -r crds/generated charts/runner-manager/crds
done_stage crds

stage "Argo CD health checks (Lua 5.1 against fixture objects)"
e2e/argocd-health.sh
done_stage argocd-health

stage "build Kubernetes $RM_K8S_VERSION (skipped when cached)"
e2e/control-plane/build-k8s.sh
done_stage build-k8s

stage "start the control plane"
e2e/control-plane/start.sh
export KUBECONFIG="$RM_RUN/kubeconfig"
done_stage start

stage "unit and integration tests (nextest)"
# The node agent's runner accounts (its installer's job on a real node).
e2e/setup-runner-accounts.sh
# The scenario tests start the project's binaries as processes: build them first.
cargo build --workspace --bins
cargo nextest run --workspace --no-fail-fast
done_stage tests

stage "the systemd launcher against a real systemd (PID 1 of its own namespaces)"
# A launcher must run where systemd's pids are its pids: inside, through nsexec.
e2e/systemd/start.sh
# --workspace: the same feature set nextest built with, so nothing is compiled again.
"${RM_SYSTEMD_STATE:-$RM_CACHE/systemd}/bin/nsexec" env -C "$root" RM_SYSTEMD_TESTS=1 \
  cargo test --workspace --test launch_systemd
e2e/systemd/stop.sh
done_stage systemd

stage "benchmarks, quick mode (dev profile: the figures prove the benches run, not the targets)"
cargo bench -p runner-manager-node-agent --bench workspace_packages --profile dev -- --quick
cargo bench -p runner-manager-e2e --bench scale_up --profile dev -- --quick
cargo bench -p runner-manager-e2e --bench operator_scale --profile dev -- --quick
done_stage benches

stage "helm chart: lint, template, install against the control plane"
e2e/chart-check.sh
done_stage chart

stage "helm chart: two releases side by side, upgrade, uninstall"
e2e/chart-releases.sh
done_stage chart-releases

if [ "$RM_K8S_VERSION" != 1.20 ] && [ "${RM_TEST_NODE:-1}" != 0 ]; then
  node_stage
fi

echo
echo "make test: all green in ${SECONDS}s"
