#!/usr/bin/env bash
# What Docker for jobs needs on a node (docs/operations.md, "Docker for jobs") and what its tests
# need besides. On the node: rootless Podman from Debian's packages (podman; uidmap for
# newuidmap; slirp4netns; netavark and aardvark-dns for the networks a job creates; catatonit).
# For the tests' stand-in jobs: a Docker CLI, taken out of Debian's docker.io package without
# installing it (its daemon is not wanted: a job's engine is Podman), and busybox-static, the
# static binary their images are built from. Idempotent; prints the CLI's path last.
#
# Podman's package enables podman.socket (a root engine's Docker socket) for the host's systemd:
# the link is removed, so a node booted from this file system never starts one.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../control-plane/env.sh"
policy= tmp=
cleanup() { [ -z "$policy" ] || rm -f "$policy"; [ -z "$tmp" ] || rm -rf "$tmp"; }
trap cleanup EXIT
need=()
for p in podman uidmap slirp4netns netavark aardvark-dns catatonit busybox-static; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}" >&2
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\n# e2e/docker/install.sh: no service starts during its install\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    policy=/usr/sbin/policy-rc.d
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
rm -f /etc/systemd/system/sockets.target.wants/podman.socket

cli="$RM_CACHE/tools/docker/docker"
if [ ! -x "$cli" ]; then
  tmp=$(mktemp -d)
  # As root, apt cannot hand the download to its sandbox user in a root-owned temporary
  # directory: the directory is made readable for it.
  chmod 0755 "$tmp"
  ( cd "$tmp" && { apt-get download -qq docker.io 2>/dev/null || { apt-get update -qq && apt-get download -qq docker.io; }; } )
  dpkg-deb --fsys-tarfile "$tmp"/docker.io_*.deb | tar -x -C "$tmp" ./usr/bin/docker
  mkdir -p "$(dirname "$cli")"
  install -m 0755 "$tmp/usr/bin/docker" "$cli"
fi
echo "$cli"
