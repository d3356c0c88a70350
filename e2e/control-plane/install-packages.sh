#!/usr/bin/env bash
# Debian packages the control plane and the tests need (lua5.1 and python3-yaml: the Argo CD health checks and their tests, e2e/argocd-health.sh; xfsprogs: the loop-mounted XFS of node-agent/tests/node_agent/packages_reflink.rs, whose seed tests otherwise skip). Idempotent: apt is only asked for what is missing.
set -euo pipefail
need=()
for p in systemd golang-go golang-github-modern-go-reflect2-dev dpkg-dev rsync jq openssl etcd-server curl unzip ca-certificates lua5.1 python3-yaml xfsprogs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
