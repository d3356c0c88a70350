#!/usr/bin/env bash
# The node's own images, into $RM_IMAGES beside the project's (e2e/images/build.sh):
#   pause     the sandbox image, built from the kubernetes module's build/pause/linux/pause.c
#             (gcc -static: the image is one file); containerd's sandbox_image
#   busybox   Debian's busybox-static, for the node's checks (e2e/cluster/check.sh)
#   coredns   the cluster DNS (e2e/cluster/build-coredns.sh), deployed by e2e/cluster/dns.sh
# Named runner-manager.local/<name>:<tag>; skipped when built. e2e/cluster/start.sh imports every
# $RM_IMAGES/*.tar into the node's containerd.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
mk=$here/../images/mkimage.sh
mkdir -p "$RM_IMAGES"
if [ ! -s "$RM_IMAGES/pause.ref" ]; then
  dir=$(cd / && go mod download -json "k8s.io/kubernetes@v$RM_K8S_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -f "$dir/build/pause/linux/pause.c" ] || { echo "cluster/images.sh: no pause.c in k8s.io/kubernetes v$RM_K8S_VERSION" >&2; exit 1; }
  r=$(mktemp -d "$RM_IMAGES/.rootfs-pause.XXXXXX")
  gcc -Os -Wall -static -DVERSION="v$RM_K8S_VERSION-rm" -o "$r/pause" "$dir/build/pause/linux/pause.c"
  d=$("$mk" runner-manager.local/pause:1 "$r" "$RM_IMAGES/pause.tar" '["/pause"]')
  rm -rf "$r"
  printf 'runner-manager.local/pause:1\nrunner-manager.local/pause@%s\n' "$d" > "$RM_IMAGES/pause.ref"
fi
if [ ! -s "$RM_IMAGES/busybox.ref" ]; then
  r=$(mktemp -d "$RM_IMAGES/.rootfs-busybox.XXXXXX")
  mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/root"
  cp /bin/busybox "$r/bin/busybox"
  for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$r/bin/$a"; done
  echo 'root:x:0:0:root:/root:/bin/sh' > "$r/etc/passwd"; echo 'root:x:0:' > "$r/etc/group"
  d=$("$mk" runner-manager.local/busybox:1 "$r" "$RM_IMAGES/busybox.tar" null '["/bin/sh"]')
  rm -rf "$r"
  printf 'runner-manager.local/busybox:1\nrunner-manager.local/busybox@%s\n' "$d" > "$RM_IMAGES/busybox.ref"
fi
coredns=$("$here/build-coredns.sh")
cv=$("$coredns" -version | sed -n 's/^CoreDNS-//p')
if [ "$(sed -n 1p "$RM_IMAGES/coredns.ref" 2>/dev/null)" != "runner-manager.local/coredns:$cv" ]; then
  r=$(mktemp -d "$RM_IMAGES/.rootfs-coredns.XXXXXX")
  mkdir -p "$r/usr/bin" "$r/etc/coredns"
  cp "$coredns" "$r/usr/bin/coredns"
  d=$("$mk" "runner-manager.local/coredns:$cv" "$r" "$RM_IMAGES/coredns.tar" '["/usr/bin/coredns"]' '["-conf", "/etc/coredns/Corefile"]')
  rm -rf "$r"
  printf 'runner-manager.local/coredns:%s\nrunner-manager.local/coredns@%s\n' "$cv" "$d" > "$RM_IMAGES/coredns.ref"
fi
cat "$RM_IMAGES"/pause.ref "$RM_IMAGES"/busybox.ref "$RM_IMAGES"/coredns.ref
