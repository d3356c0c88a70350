#!/usr/bin/env bash
# Proves the node of e2e/cluster/start.sh runs pods as a real node does:
#   a) a pod on the pod network (CNI bridge) runs an imported image, referenced by digest and
#      never pulled, to Succeeded; its log comes back through the API server from the kubelet;
#   b) it reaches the API server's address through the `kubernetes` Service (kube-proxy's DNAT)
#      and has its service-account token mounted;
#   c) a privileged hostPID DaemonSet pod, as the node agent runs, sees the node's systemd as PID 1
#      and, through a hostPath, the node's /run/systemd, where systemctl answers;
#   d) the node agent's image runs there too, its systemctl answered by the node's systemd.
# Needs: KUBECONFIG of that cluster (default $RM_CLUSTER_RUN/kubeconfig). Removes its namespace.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
export KUBECONFIG=${KUBECONFIG:-$RM_CLUSTER_RUN/kubeconfig}
K() { "$RM_TOOLS_BIN/kubectl" "$@"; }
ns=rm-node-check
BB=$(sed -n 2p "$RM_IMAGES/busybox.ref")
AGENT=$(sed -n 2p "$RM_IMAGES/node-agent.ref" 2>/dev/null || true)
t0=$(date +%s%N)
say() { local ms=$(( ($(date +%s%N) - t0) / 1000000 )); printf 'cluster/check.sh [%d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*"; }
fail() {
  echo "cluster/check.sh: FAIL: $*" >&2
  K -n $ns get pods -o wide >&2 || true
  K -n $ns describe pods 2>&1 | tail -30 >&2 || true
  exit 1
}
# phase POD: waits up to 90 s for Succeeded or Failed, prints it (what it was at 90 s otherwise).
phase() {
  local p=
  for _ in $(seq 1 180); do
    p=$(K -n $ns get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null) || true
    case "$p" in Succeeded|Failed) break ;; esac
    sleep 0.5
  done
  echo "$p"
}
trap 'K delete ns $ns --wait=false >/dev/null 2>&1 || true' EXIT
# A namespace left by an earlier run may still be terminating.
K delete ns $ns --ignore-not-found --timeout=60s >/dev/null
K create ns $ns >/dev/null
# The pods need the namespace's default ServiceAccount (the controller manager makes it): waited
# for, and named if it never comes, rather than a pod refused for want of it.
sa=
for _ in $(seq 1 120); do K -n $ns get serviceaccount default >/dev/null 2>&1 && { sa=1; break; }; sleep 0.25; done
[ -n "$sa" ] || fail "no ServiceAccount default in namespace $ns 30 s after its creation (the controller manager's serviceaccount controller)"

K -n $ns apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: podnet}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: $BB
    imagePullPolicy: IfNotPresent
    command: [/bin/sh, -c]
    args:
    - |
      set -e
      echo "pod ip: \$(ip -4 -o addr show eth0 | awk '{print \$4}')"
      nc -w 3 \$KUBERNETES_SERVICE_HOST \$KUBERNETES_SERVICE_PORT </dev/null
      echo "service \$KUBERNETES_SERVICE_HOST:\$KUBERNETES_SERVICE_PORT reachable"
      test -s /var/run/secrets/kubernetes.io/serviceaccount/token && echo "token mounted"
YAML
[ "$(phase podnet)" = Succeeded ] || fail "a) the pod-network pod did not succeed: $(K -n $ns logs podnet 2>&1 | tr '\n' ';')"
log=$(K -n $ns logs podnet)
case "$log" in *"pod ip: ${RM_CLUSTER_POD_CIDR%.*}."*) ;; *) fail "a) no pod-network address: $log" ;; esac
case "$log" in *"reachable"*"token mounted"*) ;; *) fail "b) the kubernetes Service is not reachable: $log" ;; esac
say "a) b) pod-network pod Succeeded; its log: $(echo "$log" | tr '\n' ';')"

K -n $ns apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: hostpid}
spec:
  selector: {matchLabels: {app: hostpid}}
  template:
    metadata: {labels: {app: hostpid}}
    spec:
      hostPID: true
      terminationGracePeriodSeconds: 1
      containers:
      - name: c
        image: $BB
        imagePullPolicy: IfNotPresent
        command: [/bin/sh, -c, "sleep 3600"]
        securityContext: {privileged: true}
        volumeMounts:
        - {name: run-systemd, mountPath: /run/systemd}
        - {name: host-root, mountPath: /host, mountPropagation: Bidirectional}
      volumes:
      - {name: run-systemd, hostPath: {path: /run/systemd, type: Directory}}
      - {name: host-root, hostPath: {path: /var/lib/runner-manager-check, type: DirectoryOrCreate}}
YAML
K -n $ns rollout status ds/hostpid --timeout=90s >/dev/null || fail "c) the hostPID DaemonSet is not ready"
pod=$(K -n $ns get pods -l app=hostpid -o jsonpath='{.items[0].metadata.name}')
comm=$(K -n $ns exec "$pod" -- cat /proc/1/comm)
[ "$comm" = systemd ] || fail "c) PID 1 seen from the hostPID pod is '$comm', not systemd"
K -n $ns exec "$pod" -- test -S /run/systemd/private || fail "c) no /run/systemd/private through the hostPath"
say "c) hostPID DaemonSet pod Running: PID 1 is systemd, /run/systemd/private there (kubectl exec)"

if [ -n "$AGENT" ]; then
  K -n $ns apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: agent-image}
spec:
  hostPID: true
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: $AGENT
    imagePullPolicy: IfNotPresent
    command: [/usr/bin/systemctl, show, --property=Version, --property=SystemState]
    # Without it systemctl sees PID 1's other root as a chroot and ignores every command (exit 0).
    env: [{name: SYSTEMD_IGNORE_CHROOT, value: "1"}]
    securityContext: {privileged: true}
    volumeMounts: [{name: run-systemd, mountPath: /run/systemd}]
  volumes: [{name: run-systemd, hostPath: {path: /run/systemd, type: Directory}}]
YAML
  [ "$(phase agent-image)" = Succeeded ] || fail "d) systemctl from the agent image: $(K -n $ns logs agent-image 2>&1 | tr '\n' ';')"
  out=$(K -n $ns logs agent-image)
  case "$out" in *SystemState=running*|*SystemState=degraded*) ;; *) fail "d) systemctl in the agent image did not reach the node's systemd: $out" ;; esac
  say "d) the node agent image ($AGENT) ran; its systemctl reached the node's systemd: $(K -n $ns logs agent-image | tr "\n" " ")"
fi
echo "cluster/check.sh: all checks passed"
