#!/usr/bin/env bash
# Debian packages a real node needs (e2e/cluster/start.sh): containerd, runc, the CNI plugins,
# iptables (kube-proxy), conntrack, busybox-static (the node's check image) and gcc (the static
# pause binary); prometheus (its server and promtool) and tinyproxy-bin, which e2e/cluster/helm-check.sh runs
# against the product (e2e/cluster/prometheus.sh). Idempotent: apt is only asked for what is
# missing. Installing them starts nothing here: the host's PID 1 is not systemd (the node runs
# its own), and where no policy-rc.d forbids service starts one is put in place for the install
# and removed after it, so the packaged Prometheus daemon is never started.
set -euo pipefail
need=()
for p in containerd runc containernetworking-plugins iptables conntrack busybox-static gcc libc6-dev iproute2 prometheus tinyproxy-bin; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}"
  policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\n# e2e/cluster/install-packages.sh: no service starts during its install\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    policy=/usr/sbin/policy-rc.d
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
