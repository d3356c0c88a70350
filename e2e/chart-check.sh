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
# Helm reads YAML numbers as floats: a large one quoted as is renders "8.388608e+06", which the
# binaries refuse, and every pod crash-loops (seen on the first install on a real node).
if rendered=$(helm template rm charts/runner-manager) && grep -nE '"[0-9.]+e[+-]?[0-9]+"' <<<"$rendered"; then
  echo "the chart renders a number in exponent form (pipe it through int64)" >&2; exit 1
fi
# The OCI switch (docs/oci.md) reaches the agent's flags: off by default (the agents reject OCI
# attempts), on with its deadlines when nodeAgent.oci.enabled.
oci_env() { helm template rm charts/runner-manager "$@" | grep -oE 'name: RM_OCI[A-Z_]*, value: "[^"]*"' | tr '\n' ' '; }
want='name: RM_OCI, value: "false" name: RM_OCI_START_DEADLINE_SECONDS, value: "300" name: RM_OCI_HANDOFF_DEADLINE_SECONDS, value: "60" '
[ "$(oci_env)" = "$want" ] || { echo "the chart's default OCI flags are not off with 300/60 s: $(oci_env)" >&2; exit 1; }
want='name: RM_OCI, value: "true" name: RM_OCI_START_DEADLINE_SECONDS, value: "45" name: RM_OCI_HANDOFF_DEADLINE_SECONDS, value: "7" '
got=$(oci_env --set nodeAgent.oci.enabled=true --set nodeAgent.oci.startDeadlineSeconds=45 --set nodeAgent.oci.handoffDeadlineSeconds=7)
[ "$got" = "$want" ] || { echo "nodeAgent.oci does not reach the agent's flags: $got" >&2; exit 1; }
# The chart sets RM_OCI* and RM_MATERIALIZE itself: the same names in nodeAgent.extraEnv (the
# older docs' way to turn OCI on) would render a duplicate env name, so the render fails and
# names the value to set instead.
for name in RM_OCI RM_OCI_START_DEADLINE_SECONDS RM_MATERIALIZE; do
  if err=$(helm template rm charts/runner-manager --set "nodeAgent.extraEnv[0].name=$name" \
      --set "nodeAgent.extraEnv[0].value=true" 2>&1 >/dev/null); then
    echo "nodeAgent.extraEnv setting $name rendered (a duplicate env name)" >&2; exit 1
  fi
  case $name in RM_OCI*) value=nodeAgent.oci.enabled ;; *) value=nodeAgent.materialize ;; esac
  grep -q "$value" <<<"$err" || { echo "the render's failure for extraEnv $name does not name $value: $err" >&2; exit 1; }
done
helm template rm charts/runner-manager --set nodeAgent.extraEnv[0].name=RM_PACKAGE_MAX_BYTES \
  --set-string nodeAgent.extraEnv[0].value=1 >/dev/null
# The default materializer is auto (overlay where the node supports it): the agent is told so,
# and the host root is mounted Bidirectional so its overlays reach the host, with no second
# Bidirectional volume for a slots root inside it; copy keeps both HostToContainer.
default=$(helm template rm charts/runner-manager)
grep -A1 'name: RM_MATERIALIZE' <<<"$default" | grep -q '"auto"' \
  || grep -q '{name: RM_MATERIALIZE, value: "auto"}' <<<"$default" \
  || { echo "the chart's default render does not set RM_MATERIALIZE=auto" >&2; exit 1; }
[ "$(grep -c 'mountPropagation: Bidirectional' <<<"$default")" = 1 ] \
  || { echo "the default render must mount exactly one volume Bidirectional (the host root)" >&2; exit 1; }
grep -q '{name: host-root, mountPath: [^,]*, mountPropagation: Bidirectional}' <<<"$default" \
  || { echo "the default render does not mount the host root Bidirectional" >&2; exit 1; }
copy=$(helm template rm charts/runner-manager --set nodeAgent.materialize=copy)
if grep -q 'mountPropagation: Bidirectional' <<<"$copy"; then echo "materialize=copy renders a Bidirectional volume" >&2; exit 1; fi
if err=$(helm template rm charts/runner-manager --set nodeAgent.slotsRoot=/srv/rm \
    --set nodeAgent.hostRoot=/srv/rm/host 2>&1 >/dev/null); then
  echo "a host root inside the slots root rendered two nested Bidirectional volumes" >&2; exit 1
fi
grep -q 'nodeAgent.hostRoot' <<<"$err" || { echo "the nested-roots failure does not name nodeAgent.hostRoot: $err" >&2; exit 1; }
# Issue 33 item 5: a private CA (caBundle) reaches both binaries, as a file they are told of.
ca=$(helm template rm charts/runner-manager --set caBundle.configMap=corp-ca --set caBundle.key=corp.pem)
for env in RM_GITHUB_CA_FILE RM_DOWNLOAD_CA_FILE; do
  grep -q "{name: $env, value: \"/etc/runner-manager/ca/corp.pem\"}" <<<"$ca" \
    || { echo "caBundle: $env is not rendered" >&2; exit 1; }
done
[ "$(grep -c '{name: ca-bundle, mountPath: /etc/runner-manager/ca, readOnly: true}' <<<"$ca")" = 2 ] \
  || { echo "caBundle: not mounted read-only in both the operator and the agent" >&2; exit 1; }
if helm template rm charts/runner-manager | grep -q 'ca-bundle\|_CA_FILE'; then
  echo "the default render trusts a CA bundle nobody gave" >&2; exit 1
fi
# Issue 33 item 5: a proxy reaches both binaries' HTTP clients, and never the cluster's own names:
# the agents' broker calls go direct.
px=$(helm template rm charts/runner-manager --namespace rmns --set proxy.https=http://proxy.corp:3128 \
  --set-json 'proxy.noProxy=[".corp.example"]')
[ "$(grep -c '{name: HTTPS_PROXY, value: "http://proxy.corp:3128"}' <<<"$px")" = 2 ] \
  || { echo "proxy: HTTPS_PROXY is not rendered on both the operator and the agent" >&2; exit 1; }
noproxy=$(grep -o '{name: NO_PROXY, value: "[^"]*"}' <<<"$px" | sort -u)
[ "$(grep -c . <<<"$noproxy")" = 1 ] || { echo "proxy: the operator's and the agent's NO_PROXY differ: $noproxy" >&2; exit 1; }
for direct in .svc .cluster.local rm-runner-manager-broker.rmns.svc localhost .corp.example; do
  grep -q "[\",]$direct[,\"]" <<<"$noproxy" || { echo "proxy: NO_PROXY lacks $direct: $noproxy" >&2; exit 1; }
done
if helm template rm charts/runner-manager | grep -q '_PROXY'; then
  echo "the default render sets a proxy nobody gave" >&2; exit 1
fi
e2e/render-manifests.sh --check
kubectl apply -f deploy/namespace.yaml >/dev/null
# Issue 33 item 5: the namespace admits the privileged node agent under Pod Security Admission.
[ "$(kubectl get namespace runner-manager-system -o jsonpath='{.metadata.labels.pod-security\.kubernetes\.io/enforce}')" = privileged ] \
  || { echo "deploy/namespace.yaml: the namespace lacks pod-security.kubernetes.io/enforce=privileged (the node agent is privileged)" >&2; exit 1; }
# --validate=false: the rendered manifests target current clusters (DaemonSet maxSurge, 1.21+);
# a 1.20 server prunes that one field, which is what this check accepts.
kubectl kustomize deploy/ | kubectl apply --dry-run=server --validate=false -f - >/dev/null
echo "deploy/ kustomization: accepted by the API server (dry run)"
ns=runner-manager-system
# Issue 28 item 2: the plain manifests never grant what the chart grants only with a guard. The
# agent's ServiceAccount and RBAC objects of `kubectl kustomize deploy/` are applied for real (the
# rest would start a second operator and webhook in the shared cluster), then the API server is
# asked what that account may do to pods: nothing but read.
plain_agent() {
  kubectl kustomize deploy/ | python3 -c '
import sys, yaml
kinds = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
docs = [d for d in yaml.safe_load_all(sys.stdin) if d and d["kind"] in kinds and "node-agent" in d["metadata"]["name"]]
assert len(docs) == 5, [d["kind"] for d in docs]
yaml.safe_dump_all(docs, sys.stdout)'
}
plain_agent | kubectl apply -f - >/dev/null
as="--as=system:serviceaccount:$ns:runner-manager-node-agent"
kubectl auth can-i patch runnerattempts.runner-manager.dev --subresource=status -n team-a $as >/dev/null
for denied in "create pods -n team-a" "update pods -n team-a" "patch pods -n team-a" "delete pods -n team-a" \
              "update pods --subresource=ephemeralcontainers -n team-a" "patch pods --subresource=ephemeralcontainers -n team-a" \
              "create pods --subresource=eviction -n team-a" "create pods --subresource=exec -n team-a" \
              "create pods --all-namespaces" "delete pods --all-namespaces"; do
  if kubectl auth can-i $denied $as >/dev/null 2>&1; then
    plain_agent | kubectl delete -f - >/dev/null
    echo "the plain manifests let the node agent $denied: they must not" >&2; exit 1
  fi
done
plain_agent | kubectl delete -f - >/dev/null
echo "deploy/ plain manifests: the node agent has no pod write right"
# Idempotent: a release left by an interrupted run is removed first.
helm uninstall runner-manager -n "$ns" >/dev/null 2>&1 || true
# --force-conflicts: the CRDs may already be applied server-side by another field manager (the
# operator applies its own at start, and the tests do).
# The admission webhook (failurePolicy Fail) would intercept every RunnerAttempt write in the
# shared test cluster while this release's operator stays Pending: scope it to namespaces
# labelled for this check only.
scoped=(--set-json 'admissionWebhook.namespaceSelector={"matchLabels":{"runner-manager.dev/chart-check":"only"}}')
helm install runner-manager charts/runner-manager -n "$ns" --create-namespace --force-conflicts "${scoped[@]}" >/dev/null
trap 'helm uninstall runner-manager -n "$ns" >/dev/null 2>&1 || true' EXIT
kubectl -n "$ns" get deployment/runner-manager-operator daemonset/runner-manager-node-agent \
  service/runner-manager-broker serviceaccount/runner-manager-node-agent >/dev/null
strategy=$(kubectl -n "$ns" get daemonset/runner-manager-node-agent -o jsonpath='{.spec.updateStrategy.rollingUpdate.maxSurge}')
# 1.20 has no DaemonSet maxSurge (it cannot surge at all); from 1.21 the chart pins it to 0.
if [ -n "$strategy" ] && [ "$strategy" != "0" ]; then
  echo "the agent DaemonSet must never surge: maxSurge is $strategy" >&2; exit 1
fi
# Least privilege, as the API server evaluates it. Pods (issue 16, issue 28 item 1): the agent
# reads the pods of its node and writes none; the operator makes and removes them when an agent
# orders them through the broker (e2e/tests/e2e/attacks_pods.rs and broker.rs attack both).
as="--as=system:serviceaccount:$ns:runner-manager-node-agent"
kubectl auth can-i patch runnerattempts.runner-manager.dev --subresource=status -n team-a $as >/dev/null
kubectl auth can-i watch pods --all-namespaces $as >/dev/null
for denied in "get secrets -n team-a" "get configmaps -n team-a" "update runnerattempts.runner-manager.dev -n team-a" \
              "update runnerattempts.runner-manager.dev --subresource=finalizers -n team-a" "delete runnerattempts.runner-manager.dev -n team-a" \
              "create pods -n team-a" "create pods --all-namespaces" "delete pods -n team-a" "deletecollection pods -n team-a" \
              "update pods -n team-a" "patch pods -n team-a" "create pods --subresource=exec -n team-a" \
              "create pods --subresource=eviction -n team-a" "update pods --subresource=status -n team-a" \
              "update pods --subresource=ephemeralcontainers -n team-a" "patch pods --subresource=ephemeralcontainers -n team-a" \
              "get pods --subresource=exec -n team-a"; do
  if kubectl auth can-i $denied $as >/dev/null 2>&1; then
    echo "the node agent may $denied: it must not" >&2; exit 1
  fi
done
# The broker reads the agent DaemonSet (its uid) to know which pods are agents.
kubectl auth can-i get daemonsets.apps/runner-manager-node-agent -n "$ns" \
  --as="system:serviceaccount:$ns:runner-manager-operator" >/dev/null
# The operator (issue 13 finding 7): Secrets and ConfigMaps by get only, CRDs, its certificate
# Secret, CA ConfigMap and leader Lease by name; the agents' node confinement is registered; the
# pods it builds for the agents created and deleted, never changed, listed or exec'd into.
op="--as=system:serviceaccount:$ns:runner-manager-operator"
for allowed in "get secrets -n team-a" "get configmaps -n team-a" \
               "patch customresourcedefinitions.apiextensions.k8s.io/runnerattempts.runner-manager.dev" \
               "update secrets/runner-manager-broker-tls -n $ns" "patch configmaps/runner-manager-broker-ca -n $ns" \
               "update leases.coordination.k8s.io/runner-manager-operator -n $ns" \
               "update validatingwebhookconfigurations.admissionregistration.k8s.io/runner-manager-$ns" \
               "create pods -n team-a" "delete pods -n team-a" "get pods -n team-a"; do
  kubectl auth can-i $allowed $op >/dev/null || { echo "the operator may not $allowed: it must" >&2; exit 1; }
done
for denied in "list secrets --all-namespaces" "watch secrets --all-namespaces" "list secrets -n team-a" "list secrets -n $ns" \
              "list configmaps --all-namespaces" "watch configmaps -n team-a" \
              "update secrets -n team-a" "update secrets/other -n $ns" "update configmaps/other -n $ns" \
              "patch customresourcedefinitions.apiextensions.k8s.io/other.example.com" "delete customresourcedefinitions.apiextensions.k8s.io" \
              "update leases.coordination.k8s.io/other -n $ns" "update leases.coordination.k8s.io -n kube-node-lease" \
              "update validatingwebhookconfigurations.admissionregistration.k8s.io/other" \
              "list pods --all-namespaces" "update pods -n team-a" "patch pods -n team-a" \
              "create pods --subresource=exec -n team-a" "patch pods --subresource=ephemeralcontainers -n team-a"; do
  if kubectl auth can-i $denied $op >/dev/null 2>&1; then
    echo "the operator may $denied: it must not" >&2; exit 1
  fi
done
# The placeholders' PriorityClass is for the operator's placeholders only (issue 28
# item 6): a pod of that class from anyone else, the cluster admin included, is refused. The API
# server takes a new policy up within moments: asked again, bounded, until it answers.
pc="runner-manager-$ns-placeholder"
kubectl get validatingadmissionpolicy "runner-manager-$ns-placeholder-priority" >/dev/null
refused=
for _ in $(seq 1 30); do
  out=$(kubectl run pc-thief -n "$ns" --image=registry.k8s.io/pause:3.10 --restart=Never --dry-run=server \
    --overrides="{\"apiVersion\":\"v1\",\"spec\":{\"priorityClassName\":\"$pc\"}}" 2>&1 || true)
  case "$out" in *"is for runner-manager's placeholder pods only"*) refused=1; break ;; esac
  sleep 1
done
[ -n "$refused" ] || { echo "a tenant's pod of the placeholder PriorityClass was not refused: $out" >&2; exit 1; }
failure=$(kubectl get validatingwebhookconfiguration "runner-manager-$ns" -o jsonpath='{.webhooks[*].failurePolicy}')
[ "$failure" = "Fail Fail" ] || { echo "the admission webhook's failurePolicy is '$failure', not Fail" >&2; exit 1; }
echo "helm install: objects created, agent and operator RBAC are least-privilege, admission webhook registered"
helm uninstall runner-manager -n "$ns" >/dev/null
trap - EXIT
