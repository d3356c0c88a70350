#!/usr/bin/env bash
# Debian packages a real node needs (e2e/cluster/start.sh): containerd, runc, the CNI plugins,
# iptables (kube-proxy), conntrack, busybox-static (the node's check image) and gcc (the static
# pause binary). Idempotent: apt is only asked for what is missing. Installing containerd starts
# nothing here: the host's PID 1 is not systemd; the node runs its own.
set -euo pipefail
need=()
for p in containerd runc containernetworking-plugins iptables conntrack busybox-static gcc libc6-dev iproute2; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
