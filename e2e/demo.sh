#!/usr/bin/env bash
# `make demo`, today: a local control plane (or the cluster KUBECONFIG points at), the CRDs, the
# sample policies, and what `kubectl` shows of them. The full loop (operator, agents, simulated
# GitHub, runners) arrives with the end-to-end issue.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. e2e/control-plane/env.sh
e2e/control-plane/install-tools.sh >/dev/null
if [ -n "${KUBECONFIG:-}" ] && kubectl version >/dev/null 2>&1; then
  echo "using the cluster KUBECONFIG points at"
else
  export RM_RUN="$RM_CACHE/demo-run"
  e2e/control-plane/build-k8s.sh
  if ! { [ -f "$RM_RUN/apiserver.pid" ] && kill -0 "$(cat "$RM_RUN/apiserver.pid")" 2>/dev/null; }; then
    e2e/control-plane/start.sh
  fi
  export KUBECONFIG="$RM_RUN/kubeconfig"
fi
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }
say kubectl apply --server-side --field-manager=runner-manager-demo -f crds/generated/
kubectl wait --for condition=established --timeout=60s \
  crd/scalepolicies.runner-manager.dev crd/runnerattempts.runner-manager.dev >/dev/null
kubectl create namespace demo --dry-run=client -o yaml | kubectl apply -f - >/dev/null
say kubectl apply -n demo -f deploy/samples/
say kubectl get sp,ra -n demo
echo
echo "(no RunnerAttempts yet: the operator's controllers and the node agent do not run in this build)"
# The published OpenAPI v2 document picks up new CRDs a moment after they are Established.
for _ in $(seq 1 50); do
  kubectl explain scalepolicy.spec --output=plaintext-openapiv2 >/dev/null 2>&1 && break
  sleep 0.2
done
say kubectl explain scalepolicy.spec --output=plaintext-openapiv2
say kubectl apply -n demo -f e2e/testdata/invalid/zero-labels.yaml --dry-run=server || true
cat <<MSG

The control plane keeps running: export KUBECONFIG=$KUBECONFIG
Stop it with: make demo-down
MSG
