#!/usr/bin/env bash
# The chart and the plain manifests against the running control plane ($KUBECONFIG): lint,
# freshness of deploy/manifests, server-side dry run of the kustomization, a real helm install
# (pods stay Pending: there is no kubelet), the objects it made, and an uninstall.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. e2e/control-plane/env.sh
: "${KUBECONFIG:?chart-check needs KUBECONFIG pointing at the control plane}"
helm lint --strict charts/runner-manager
e2e/render-manifests.sh --check
kubectl apply -f deploy/namespace.yaml >/dev/null
# --validate=false: the rendered manifests target current clusters (DaemonSet maxSurge, 1.21+);
# a 1.20 server prunes that one field, which is what this check accepts.
kubectl kustomize deploy/ | kubectl apply --dry-run=server --validate=false -f - >/dev/null
echo "deploy/ kustomization: accepted by the API server (dry run)"
ns=runner-manager-system
# Idempotent: a release left by an interrupted run is removed first.
helm uninstall runner-manager -n "$ns" >/dev/null 2>&1 || true
# --force-conflicts: the CRDs may already be applied server-side by another field manager (the
# operator applies its own at start, and the tests do).
helm install runner-manager charts/runner-manager -n "$ns" --create-namespace --force-conflicts >/dev/null
trap 'helm uninstall runner-manager -n "$ns" >/dev/null 2>&1 || true' EXIT
kubectl -n "$ns" get deployment/runner-manager-operator daemonset/runner-manager-node-agent \
  service/runner-manager-broker serviceaccount/runner-manager-node-agent >/dev/null
strategy=$(kubectl -n "$ns" get daemonset/runner-manager-node-agent -o jsonpath='{.spec.updateStrategy.rollingUpdate.maxSurge}')
# 1.20 has no DaemonSet maxSurge (it cannot surge at all); from 1.21 the chart pins it to 0.
if [ -n "$strategy" ] && [ "$strategy" != "0" ]; then
  echo "the agent DaemonSet must never surge: maxSurge is $strategy" >&2; exit 1
fi
# Least privilege, as the API server evaluates it. No pods rights at all (issue 13): one node's
# agent token must not create a pod running as another ServiceAccount, a privileged pod on any
# node, or a pod posing as another node's agent.
as="--as=system:serviceaccount:$ns:runner-manager-node-agent"
kubectl auth can-i patch runnerattempts.runner-manager.dev --subresource=status -n team-a $as >/dev/null
for denied in "get secrets -n team-a" "get configmaps -n team-a" "update runnerattempts.runner-manager.dev -n team-a" \
              "update runnerattempts.runner-manager.dev --subresource=finalizers -n team-a" "delete runnerattempts.runner-manager.dev -n team-a" \
              "create pods --all-namespaces" "create pods -n $ns" "create pods -n team-a" \
              "delete pods --all-namespaces" "delete pods -n $ns" "get pods -n $ns" "list pods --all-namespaces"; do
  if kubectl auth can-i $denied $as >/dev/null 2>&1; then
    echo "the node agent may $denied: it must not" >&2; exit 1
  fi
done
# The broker reads the agent DaemonSet (its uid) to know which pods are agents.
kubectl auth can-i get daemonsets.apps/runner-manager-node-agent -n "$ns" \
  --as="system:serviceaccount:$ns:runner-manager-operator" >/dev/null
echo "helm install: objects created, agent RBAC is least-privilege"
helm uninstall runner-manager -n "$ns" >/dev/null
trap - EXIT
