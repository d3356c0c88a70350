#!/usr/bin/env bash
# The chart as Helm users meet it, against the running control plane ($KUBECONFIG):
# `helm lint --strict` with the default and a maximal set of values, `helm template`, then two
# releases in two namespaces side by side (distinct object names, cluster-scoped names and
# bindings, each operator told its own release's names), an upgrade of one (replicas, PDB,
# digest, pull secrets, placement), and both uninstalled with the CRDs kept. Pods stay Pending:
# the control plane has no kubelet.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. e2e/control-plane/env.sh
: "${KUBECONFIG:?chart-releases needs KUBECONFIG pointing at the control plane}"
chart=charts/runner-manager
tmp=$(mktemp -d)
ns_a=rm-chart-a ns_b=rm-chart-b
rel_a=runner-manager rel_b=ci
cleanup() {
  helm uninstall "$rel_a" -n "$ns_a" >/dev/null 2>&1 || true
  helm uninstall "$rel_b" -n "$ns_b" >/dev/null 2>&1 || true
  kubectl delete namespace "$ns_a" "$ns_b" --wait=false >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "chart-releases: $*" >&2; exit 1; }

cat > "$tmp/full.yaml" <<'VALUES'
fullnameOverride: ""
commonLabels: {team: platform}
global: {imageRegistry: registry.example.com}
imagePullSecrets: [regcred, {name: other}]
image:
  operator: {repository: rm/operator, digest: "sha256:0000000000000000000000000000000000000000000000000000000000000001"}
  nodeAgent: {registry: mirror.example.com, repository: rm/node-agent, tag: "9.9.9"}
crds: {managedBy: external}
operator:
  replicas: 2
  logLevel: debug
  watchNamespace: team-b
  observeInterval: 45s
  podDisruptionBudget: {enabled: true, minAvailable: 1}
  priorityClassName: system-cluster-critical
  affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 100, podAffinityTerm: {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app.kubernetes.io/component: operator}}}}]}}
  tolerations: [{key: dedicated, operator: Equal, value: ci, effect: NoSchedule}]
  extraEnv: [{name: EXTRA, value: "1"}]
nodeAgent:
  nodeSelector: {runner-manager.dev/pool: ci}
  tolerations: [{key: dedicated, operator: Exists}]
  priorityClassName: system-node-critical
  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/os, operator: In, values: [linux]}]}]}}}
  hostRoot: /var/lib/rm-ci
  slotsRoot: /var/lib/rm-ci/slots
  # null drops the default httpGet: Helm merges maps, and two handlers are refused.
  livenessProbe: {exec: {command: [/bin/true]}, httpGet: null}
webhook: {secretName: ci-webhook}
VALUES

helm lint --strict "$chart" >/dev/null
helm lint --strict "$chart" -f "$tmp/full.yaml" >/dev/null
# The schema refuses what the binaries would refuse later.
for bad in "nodeAgent.launcher=fork" "operator.observeInterval=30 seconds" "crds.managedBy=helm" "operator.replicas=0" "noSuchValue=1"; do
  if helm template x "$chart" --set "$bad" >/dev/null 2>&1; then fail "values.schema.json accepts --set $bad"; fi
done
echo "helm lint --strict: default and full values pass; the schema refuses bad values"

helm template "$rel_b" "$chart" -n "$ns_b" -f "$tmp/full.yaml" > "$tmp/b.yaml"
grep -q 'image: registry.example.com/rm/operator@sha256:0\{63\}1' "$tmp/b.yaml" || fail "the operator image is not registry/repository@digest"
grep -q 'image: mirror.example.com/rm/node-agent:9.9.9' "$tmp/b.yaml" || fail "the agent image does not use its own registry and tag"
grep -q 'helm.sh/chart: runner-manager-' "$tmp/b.yaml" || fail "no helm.sh/chart label"
grep -q 'kind: PodDisruptionBudget' "$tmp/b.yaml" || fail "no PodDisruptionBudget"
grep -q 'name: RM_APPLY_CRDS, value: "false"' "$tmp/b.yaml" || fail "crds.managedBy=external does not turn off the operator's CRD apply"
grep -q 'name: RM_BROKER_SERVICE, value: "ci-runner-manager-broker"' "$tmp/b.yaml" || fail "the operator is not told its broker Service"
grep -q 'https://ci-runner-manager-broker.rm-chart-b.svc:8443' "$tmp/b.yaml" || fail "the agent is not pointed at its release's broker"
grep -q 'priorityClassName: system-node-critical' "$tmp/b.yaml" || fail "no agent priority class"
[ "$(grep -c -- '- name: regcred' "$tmp/b.yaml")" -eq 2 ] || fail "imagePullSecrets missing from a pod template"
echo "helm template: images, labels, PDB, flags and release-scoped names as configured"

kubectl create namespace "$ns_a" >/dev/null
kubectl create namespace "$ns_b" >/dev/null
for ns in "$ns_a" "$ns_b"; do
  kubectl label namespace "$ns" pod-security.kubernetes.io/enforce=privileged >/dev/null
done
# --force-conflicts: the CRDs may already be applied server-side by the operator's field manager.
# The admission webhook (failurePolicy Fail) is scoped to a label no namespace carries: these
# releases' operators never run, and the shared test cluster's attempts must stay writable.
scoped=(--set-json 'admissionWebhook.namespaceSelector={"matchLabels":{"runner-manager.dev/chart-check":"only"}}')
helm install "$rel_a" "$chart" -n "$ns_a" --force-conflicts "${scoped[@]}" >/dev/null
helm install "$rel_b" "$chart" -n "$ns_b" --force-conflicts --set operator.watchNamespace=team-b "${scoped[@]}" >/dev/null
kubectl -n "$ns_a" get deployment/runner-manager-operator daemonset/runner-manager-node-agent \
  service/runner-manager-broker service/runner-manager-webhook >/dev/null
kubectl -n "$ns_b" get deployment/ci-runner-manager-operator daemonset/ci-runner-manager-node-agent \
  service/ci-runner-manager-broker service/ci-runner-manager-webhook >/dev/null
kubectl get clusterrole "runner-manager-$ns_a-operator" "ci-runner-manager-$ns_b-operator" \
  "runner-manager-$ns_a-node-agent" "ci-runner-manager-$ns_b-node-agent" >/dev/null
# Each release's agent ServiceAccount has its own rights, and nothing in the other release's
# namespace: two installations do not share RBAC.
kubectl auth can-i patch runnerattempts.runner-manager.dev --subresource=status -n team-b \
  --as="system:serviceaccount:$ns_b:ci-runner-manager-node-agent" >/dev/null
if kubectl auth can-i update leases.coordination.k8s.io -n "$ns_a" \
  --as="system:serviceaccount:$ns_b:ci-runner-manager-node-agent" >/dev/null 2>&1; then
  fail "release $rel_b's agent may write release $rel_a's Leases"
fi
kubectl auth can-i get daemonsets.apps/ci-runner-manager-node-agent -n "$ns_b" \
  --as="system:serviceaccount:$ns_b:ci-runner-manager-operator" >/dev/null
echo "two releases side by side: $rel_a in $ns_a, $rel_b in $ns_b"

helm upgrade "$rel_b" "$chart" -n "$ns_b" --force-conflicts -f "$tmp/full.yaml" "${scoped[@]}" >/dev/null
[ "$(kubectl -n "$ns_b" get deployment/ci-runner-manager-operator -o jsonpath='{.spec.replicas}')" = 2 ] \
  || fail "the upgrade did not set 2 replicas"
kubectl -n "$ns_b" get poddisruptionbudget/ci-runner-manager-operator >/dev/null
image=$(kubectl -n "$ns_b" get daemonset/ci-runner-manager-node-agent -o jsonpath='{.spec.template.spec.containers[0].image}')
[ "$image" = mirror.example.com/rm/node-agent:9.9.9 ] || fail "the upgraded agent image is $image"
[ "$(helm history "$rel_b" -n "$ns_b" -o json | jq length)" = 2 ] || fail "release $rel_b has no second revision"
echo "helm upgrade: replicas, PDB and images changed in place"

helm uninstall "$rel_a" -n "$ns_a" >/dev/null
helm uninstall "$rel_b" -n "$ns_b" >/dev/null
if kubectl get clusterrole "runner-manager-$ns_a-operator" >/dev/null 2>&1; then fail "uninstall left a ClusterRole"; fi
kubectl get crd scalepolicies.runner-manager.dev runnerattempts.runner-manager.dev >/dev/null \
  || fail "uninstall removed the CRDs"
echo "helm uninstall: both releases gone, CRDs kept"
