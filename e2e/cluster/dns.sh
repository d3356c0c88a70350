#!/usr/bin/env bash
# The cluster DNS of the cluster of e2e/cluster/start.sh, as kind and kubeadm deploy it: CoreDNS
# (e2e/cluster/build-coredns.sh, imported image by digest) in kube-system behind the `kube-dns`
# Service at $DNS_IP, which the kubelet writes into every pod's resolv.conf (clusterDNS). Only the
# cluster's zone is served: the node has no route beyond the host, so nothing is forwarded.
# Waits until it answers for kubernetes.default.svc. Called by start.sh; safe to re-run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
export KUBECONFIG=${KUBECONFIG:-$RM_CLUSTER_RUN/kubeconfig}
K() { "$RM_TOOLS_BIN/kubectl" "$@"; }
IMAGE=$(sed -n 2p "$RM_IMAGES/coredns.ref")
[ -n "$IMAGE" ] || { echo "cluster/dns.sh: no coredns image: run e2e/cluster/images.sh" >&2; exit 1; }
K apply -f - >/dev/null <<YAML
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        cache 30
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      terminationGracePeriodSeconds: 1
      containers:
      - name: coredns
        image: $IMAGE
        imagePullPolicy: IfNotPresent
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 1}
        livenessProbe: {httpGet: {path: /health, port: 8080}}
        # Port 53 as root in the image; nothing else.
        securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}}
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes: [{name: config, configMap: {name: coredns}}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: $DNS_IP
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
YAML
K -n kube-system rollout status deploy/coredns --timeout=90s >/dev/null \
  || { K -n kube-system describe pods -l k8s-app=kube-dns | tail -20 >&2; echo "cluster/dns.sh: CoreDNS not ready" >&2; exit 1; }
# The Service's address answers once kube-proxy has programmed it. Asked from the host, which
# routes the Service range through the node (the node itself has no default route, so its own
# processes reach no ClusterIP; its pods do, through the bridge).
for _ in $(seq 1 60); do
  busybox nslookup kubernetes.default.svc.cluster.local "$DNS_IP" >/dev/null 2>&1 && exit 0
  sleep 0.5
done
echo "cluster/dns.sh: $DNS_IP does not answer for kubernetes.default.svc.cluster.local" >&2
exit 1
