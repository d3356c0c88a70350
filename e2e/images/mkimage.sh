#!/usr/bin/env bash
# mkimage.sh NAME:TAG ROOTFS_DIR OUT.tar [ENTRYPOINT_JSON [CMD_JSON [USER]]]
# A one-layer OCI image archive (oci-layout, index.json, blobs/sha256/*) of ROOTFS_DIR, written
# with tar and sha256sum alone: no daemon, no registry, no build tool. Reproducible: the same
# directory gives the same digests (sorted entries, owner 0, mtime 0, fixed config).
# Prints the manifest digest (sha256:...) on stdout. `ctr -n k8s.io images import --digests OUT.tar`
# names the image after the io.containerd.image.name annotation and NAME@digest.
set -euo pipefail
name=$1 rootfs=$2 out=$3 entry=${4:-null} cmd=${5:-null} user=${6:-}
t=$(mktemp -d "$(dirname "$out")/.mkimage.XXXXXX"); trap 'rm -rf "$t"' EXIT
mkdir -p "$t/blobs/sha256"
blob() { # FILE MEDIATYPE: moves FILE into blobs/, prints its descriptor
  local d s
  d=$(sha256sum "$1" | cut -d' ' -f1); s=$(stat -c %s "$1")
  mv "$1" "$t/blobs/sha256/$d"
  printf '{"mediaType":"%s","digest":"sha256:%s","size":%s}' "$2" "$d" "$s"
}
tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 --format=posix \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime -C "$rootfs" -cf "$t/layer" .
diffid=$(sha256sum "$t/layer" | cut -d' ' -f1)
layer=$(blob "$t/layer" application/vnd.oci.image.layer.v1.tar)
printf '{"architecture":"amd64","os":"linux","config":{"User":"%s","Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":%s,"Cmd":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
  "$user" "$entry" "$cmd" "$diffid" > "$t/config"
config=$(blob "$t/config" application/vnd.oci.image.config.v1+json)
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":%s,"layers":[%s]}' \
  "$config" "$layer" > "$t/manifest"
manifest=$(blob "$t/manifest" application/vnd.oci.image.manifest.v1+json)
digest=$(printf '%s' "$manifest" | sed 's/.*"digest":"\([^"]*\)".*/\1/')
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' \
  "${manifest%\}},\"annotations\":{\"io.containerd.image.name\":\"$name\",\"org.opencontainers.image.ref.name\":\"${name##*:}\"}}" > "$t/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' > "$t/oci-layout"
tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -C "$t" -cf "$out.tmp" oci-layout index.json blobs
mv -f "$out.tmp" "$out"
echo "$digest"
