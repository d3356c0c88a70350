#!/usr/bin/env bash
# `helm install` for real: the chart into the cluster of e2e/cluster/start.sh, with the project's
# images (e2e/images/build.sh, imported into the node's containerd) referenced by digest.
#   - the operator Deployment and the agent DaemonSet become Ready on the real kubelet, the agent
#     with the systemd launcher against the node's systemd (hostPID, /run/systemd by hostPath);
#   - the admission webhook and the broker answer through their Services (the API server calls
#     the webhook at its ClusterIP; the agents' Leases go through it);
#   - the agent pod deleted with `kubectl delete pod` comes back Ready;
#   - `helm uninstall` leaves no pod and no unit of ours on the node.
# Prints `kubectl get pods -A -o wide` while installed. Needs KUBECONFIG of that cluster (default
# $RM_CLUSTER_RUN/kubeconfig) and the images built.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/env.sh"
export KUBECONFIG=${KUBECONFIG:-$RM_CLUSTER_RUN/kubeconfig}
K() { "$RM_TOOLS_BIN/kubectl" "$@"; }
H() { "$RM_TOOLS_BIN/helm" "$@"; }
N() { "$NODE_STATE/bin/nsexec" "$@"; }
ns=runner-manager-system rel=rm
t0=$(date +%s%N)
say() { local ms=$(( ($(date +%s%N) - t0) / 1000000 )); printf 'cluster/helm-check.sh [%d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*"; }
fail() {
  echo "cluster/helm-check.sh: FAIL: $*" >&2
  K get pods -A -o wide >&2 || true
  K -n $ns logs deploy/$rel-runner-manager-operator --tail=15 >&2 2>&1 || true
  K -n $ns logs ds/$rel-runner-manager-node-agent --tail=15 >&2 2>&1 || true
  exit 1
}
imported=$'\n'$(N ctr -n k8s.io images ls -q)$'\n'
for i in operator node-agent; do
  [ -s "$RM_IMAGES/$i.ref" ] || { echo "cluster/helm-check.sh: no $i image: run e2e/images/build.sh before e2e/cluster/start.sh" >&2; exit 1; }
  case "$imported" in *$'\n'"$(sed -n 2p "$RM_IMAGES/$i.ref")"$'\n'*) ;;
    *) echo "cluster/helm-check.sh: $i image not in the node's containerd: restart the cluster after e2e/images/build.sh" >&2; exit 1 ;;
  esac
done
op=$(sed -n 2p "$RM_IMAGES/operator.ref") ag=$(sed -n 2p "$RM_IMAGES/node-agent.ref")
trap 'H uninstall $rel -n $ns >/dev/null 2>&1 || true' EXIT
H uninstall $rel -n $ns >/dev/null 2>&1 || true
# --force-conflicts: CRDs kept from an earlier install were re-applied by its operator (its field manager).
H install $rel "$root/charts/runner-manager" -n $ns --create-namespace --force-conflicts \
  --set "image.operator.digest=${op#*@}" --set "image.nodeAgent.digest=${ag#*@}" >/dev/null
say "helm install: operator ${op#*@}, node agent ${ag#*@}"
K -n $ns rollout status deploy/$rel-runner-manager-operator --timeout=120s >/dev/null || fail "the operator is not Ready"
K -n $ns rollout status ds/$rel-runner-manager-node-agent --timeout=120s >/dev/null || fail "the node agent is not Ready"
say "operator and node agent Ready on node $RM_CLUSTER_NODE"
K get pods -A -o wide
log=$(K -n $ns logs ds/$rel-runner-manager-node-agent)
case "$log" in *"launcher Systemd"*) ;; *) fail "the agent does not serve with the systemd launcher" ;; esac
# Its Lease is admitted by the operator's webhook, which the API server reaches at a ClusterIP.
lease=$(K -n $ns get lease -o name 2>/dev/null | grep -c "$RM_CLUSTER_NODE" || true)
[ "$lease" -ge 1 ] || fail "no Lease of node $RM_CLUSTER_NODE (webhook or broker unreachable)"
say "the agent serves with the systemd launcher; its node Lease passed the admission webhook"

old=$(K -n $ns get pods -l app.kubernetes.io/component=node-agent -o jsonpath='{.items[0].metadata.name}')
K -n $ns delete pod "$old" --wait=true >/dev/null
K -n $ns rollout status ds/$rel-runner-manager-node-agent --timeout=120s >/dev/null || fail "the agent did not come back after kubectl delete pod"
new=$(K -n $ns get pods -l app.kubernetes.io/component=node-agent -o jsonpath='{.items[0].metadata.name}')
[ "$new" != "$old" ] || fail "the agent pod was not replaced"
say "kubectl delete pod $old: $new Ready"

H uninstall $rel -n $ns >/dev/null
trap - EXIT
for _ in $(seq 1 120); do
  [ -z "$(K -n $ns get pods -o name 2>/dev/null)" ] && break
  sleep 0.5
done
[ -z "$(K -n $ns get pods -o name 2>/dev/null)" ] || fail "pods left after helm uninstall"
units=$(N systemctl list-units --all --plain --no-legend 'rm-*.service' 2>/dev/null || true)
[ -z "$units" ] || fail "units left on the node after helm uninstall: $units"
say "helm uninstall: no pod, no runner unit left"
echo "cluster/helm-check.sh: all checks passed"
