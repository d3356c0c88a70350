#!/usr/bin/env bash
# `make demo-processes` (or `DEMO_MODE=processes make demo`): the whole loop with the operator and
# the agents as local processes, for multi-node scenarios (two simulated nodes); `make demo` runs
# the product as users run it instead (e2e/demo.sh: a real node, images, helm install).
#
# A local control plane (v1.20 API server built from Debian's source package), the simulated
# GitHub (`fake-github`, serving the stand-in runner package), the operator, and two node agents
# as local processes — each agent a simulated node with its own Node object, agent Pod, bound
# broker token and host root. A ScalePolicy is applied, a handful of jobs are queued on the
# simulated GitHub (which delivers signed `workflow_job` webhooks to the operator), and the
# RunnerAttempts are shown as they go Pending → … → Busy → Finished → Cleaned.
#
# Everything keeps running afterwards (`make demo-down` stops it); `make demo-processes DEMO_ARGS=--stop`
# (or `e2e/demo-processes.sh --stop`) stops it at the end.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
stop_at_end=false
jobs=${DEMO_JOBS:-6}
for a in "$@"; do
  case "$a" in
    --stop) stop_at_end=true ;;
    --jobs=*) jobs=${a#--jobs=} ;;
    *) echo "demo-processes.sh: unknown option $a (known: --stop, --jobs=N)" >&2; exit 2 ;;
  esac
done

. e2e/control-plane/env.sh
export RM_RUN="$RM_CACHE/demo-run"
# Its own ports, so the development control plane (16443) and make test's are left alone.
export RM_API_PORT=${RM_DEMO_API_PORT:-16643} RM_ETCD_PORT=${RM_DEMO_ETCD_PORT:-23690} \
  RM_KCM_PORT=${RM_DEMO_KCM_PORT:-10657}
demo="$RM_RUN/demo"
say() { printf '\n\033[1m%s\033[0m\n' "$*"; }
run() { printf '\033[2m$ %s\033[0m\n' "$*"; "$@"; }

say "1/6 set-up: Debian packages, the API server build, kubectl and helm, runner accounts"
e2e/control-plane/install-packages.sh
e2e/control-plane/build-k8s.sh
e2e/control-plane/install-tools.sh >/dev/null
e2e/setup-runner-accounts.sh
cargo build --workspace --bins

say "2/6 the control plane"
e2e/demo-processes-down.sh --quiet || true
e2e/control-plane/start.sh
export KUBECONFIG="$RM_RUN/kubeconfig"
rm -rf "$demo" /var/lib/runner-manager-demo && mkdir -p "$demo/logs"
bin="$root/target/debug"

say "3/6 the simulated GitHub"
"$bin/fake-github" --package-dir "$demo/package" >"$demo/logs/fake-github.log" 2>&1 &
echo $! >"$demo/fake-github.pid"
for _ in $(seq 1 100); do grep -q '^listening on ' "$demo/logs/fake-github.log" && break; sleep 0.1; done
github=$(sed -n 's/^listening on //p' "$demo/logs/fake-github.log" | head -1)
[ -n "$github" ] || { echo "fake-github did not start: $demo/logs/fake-github.log" >&2; exit 1; }
echo "simulated GitHub at $github"
openssl genrsa -out "$demo/app.pem" 2048 2>/dev/null
admin() { curl -fsS -X "$1" -H 'content-type: application/json' "$github/_admin/$2" -d "$3"; }
admin POST app "$(jq -n --rawfile k <(openssl rsa -in "$demo/app.pem" -pubout 2>/dev/null) '{app_id: 4242, public_key_pem: $k}')" >/dev/null
admin POST installations '{"id": 777, "account": "acme"}' >/dev/null
webhook_secret=$(openssl rand -hex 20)
operator_ns=runner-manager-system

say "4/6 the operator and two node agents"
kubectl create namespace "$operator_ns" >/dev/null
kubectl create namespace demo >/dev/null
kubectl -n "$operator_ns" create secret generic runner-manager-webhook --from-literal=secret="$webhook_secret" >/dev/null
kubectl -n demo create secret generic github-app --from-literal=appId=4242 --from-file=privateKey="$demo/app.pem" >/dev/null
kubectl -n "$operator_ns" create serviceaccount runner-manager-node-agent >/dev/null
"$bin/runner-manager-operator" --namespace "$operator_ns" --github-api-url "$github" \
  --broker-addr 127.0.0.1:18443 --admission-addr 127.0.0.1:18444 --webhook-addr 127.0.0.1:18080 --metrics-addr 127.0.0.1:19090 \
  --leader-election=false --allow-http-hosts 127.0.0.1 --download-hosts 127.0.0.1 \
  >"$demo/logs/operator.log" 2>&1 &
echo $! >"$demo/operator.pid"
admin POST webhooks "$(jq -n --arg s "$webhook_secret" '{url: "http://127.0.0.1:18080/webhook", secret: $s}')" >/dev/null
for _ in $(seq 1 300); do
  kubectl -n "$operator_ns" get configmap runner-manager-broker-ca >/dev/null 2>&1 && break; sleep 0.2
done
# The broker mints only for a pod controlled (by uid) by the agent DaemonSet, calling from the
# pod's IP: the DaemonSet is an owner here (its nodeSelector matches no node; this control plane
# runs no DaemonSet controller), each agent Pod names it and reports 127.0.0.1 as its IP, as the
# e2e harness does (e2e/src/harness/node.rs).
kubectl apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: runner-manager-node-agent, namespace: $operator_ns}
spec:
  selector: {matchLabels: {app.kubernetes.io/component: node-agent}}
  template:
    metadata: {labels: {app.kubernetes.io/component: node-agent}}
    spec:
      nodeSelector: {runner-manager.dev/demo-no-such-node: "true"}
      containers: [{name: agent, image: runner-manager/node-agent:demo}]
YAML
ds_uid=$(kubectl -n "$operator_ns" get daemonset runner-manager-node-agent -o jsonpath='{.metadata.uid}')
for node in demo-node-a demo-node-b; do
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata: {name: $node, labels: {node-restriction.kubernetes.io/runner-pool: demo}}
---
apiVersion: v1
kind: Pod
metadata:
  name: agent-$node
  namespace: $operator_ns
  labels: {app.kubernetes.io/component: node-agent}
  ownerReferences:
  - {apiVersion: apps/v1, kind: DaemonSet, name: runner-manager-node-agent, uid: $ds_uid, controller: true}
spec:
  nodeName: $node
  serviceAccountName: runner-manager-node-agent
  containers: [{name: agent, image: runner-manager/node-agent:demo}]
YAML
  kubectl -n "$operator_ns" patch pod "agent-$node" --subresource=status --type=merge \
    -p '{"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}}' >/dev/null
  # Host roots live outside $HOME: the runner accounts must be able to reach their runtimes
  # (the agent refuses a root under a directory they cannot search).
  hosts=/var/lib/runner-manager-demo
  mkdir -p "$demo/$node" "$hosts/$node/host" "$hosts/$node/slots"
  chmod 755 /var/lib "$hosts" "$hosts/$node"
  kubectl -n "$operator_ns" create token runner-manager-node-agent --audience runner-manager-broker \
    --bound-object-kind Pod --bound-object-name "agent-$node" --duration 24h >"$demo/$node/broker-token"
  chmod 600 "$demo/$node/broker-token"
  "$bin/runner-manager-node-agent" --node-name "$node" --host-root "$hosts/$node/host" \
    --slots-root "$hosts/$node/slots" --capacity 3 --launcher direct \
    --broker-url https://127.0.0.1:18443 --system-namespace "$operator_ns" \
    --broker-token-file "$demo/$node/broker-token" --heartbeat-seconds 2 \
    --allow-http-hosts 127.0.0.1 >"$demo/logs/agent-$node.log" 2>&1 &
  echo $! >"$demo/agent-$node.pid"
done
echo "logs: $demo/logs/"

say "5/6 a ScalePolicy, then $jobs jobs queued on acme/web"
run kubectl apply -n demo -f - <<'YAML'
apiVersion: runner-manager.dev/v1alpha1
kind: ScalePolicy
metadata: {name: web}
spec:
  github: {url: "https://github.com/acme/web", credentialsSecretRef: {name: github-app}}
  labels: [self-hosted, linux, x64]
  minIdle: 1
  maxRunners: 6
  nodeSelector: {node-restriction.kubernetes.io/runner-pool: demo}
  runner: {version: latest}
YAML
started=$(date +%s)
job_ids=()
for i in $(seq 1 "$jobs"); do
  id=$(admin POST jobs "$(jq -n --arg n "build-$i" '{owner: "acme", repo: "web", labels: ["self-hosted", "linux"], name: $n, behaviour: {duration_ms: 3000}}')" | jq -r .job_id)
  job_ids+=("$id")
done
echo "queued jobs: ${job_ids[*]}"

say "6/6 watching (kubectl get sp,ra -n demo), until every job has completed"
deadline=$((started + ${DEMO_TIMEOUT:-240}))
while :; do
  done_count=0
  for id in "${job_ids[@]}"; do
    [ "$(curl -fsS "$github/_admin/jobs/$id" | jq -r .status)" = completed ] && done_count=$((done_count + 1))
  done
  printf '\n\033[1m-- %ss: %s/%s jobs completed --\033[0m\n' "$(( $(date +%s) - started ))" "$done_count" "$jobs"
  kubectl get sp,ra -n demo 2>&1 | sed 's/^/  /'
  [ "$done_count" -eq "$jobs" ] && break
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "not every job completed within ${DEMO_TIMEOUT:-240}s; logs in $demo/logs/" >&2
    break
  fi
  sleep 2
done

say "summary"
kubectl get ra -n demo -o json | jq -r -f "$root/e2e/demo-summary.jq"
echo "jobs completed: $done_count/$jobs in $(( $(date +%s) - started ))s"
echo "runners still registered on the simulated GitHub: $(curl -fsS "$github/_admin/runners" | jq 'length')"

if $stop_at_end; then
  e2e/demo-processes-down.sh
else
  cat <<MSG

Everything keeps running:
  export KUBECONFIG=$KUBECONFIG
  kubectl get sp,ra -n demo -w
  simulated GitHub: $github   logs: $demo/logs/
Stop it all with: make demo-down
MSG
fi
