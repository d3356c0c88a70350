#!/usr/bin/env bash
# Imports every image of $RM_IMAGES (e2e/images/build.sh, e2e/cluster/images.sh) into the running
# node's containerd, by its name and by its digest reference (NAME@sha256:..., what the chart
# uses), skipping those already there: the way a rebuilt image reaches the node without a
# registry or a restart (`helm upgrade` to a new digest). Prints the images it imported.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
[ -x "$NODE_STATE/bin/nsexec" ] || { echo "cluster/load-images.sh: no node running from $RM_CLUSTER_RUN" >&2; exit 1; }
CTR() { "$NODE_STATE/bin/nsexec" ctr -n k8s.io "$@"; }
have=$'\n'$(CTR images ls -q)$'\n'
for i in "$RM_IMAGES"/*.tar; do
  ref=$(sed -n 2p "${i%.tar}.ref")
  case "$have" in *$'\n'"$ref"$'\n'*) continue ;; esac
  CTR images import "$i" >/dev/null
  CTR images tag --force "$(sed -n 1p "${i%.tar}.ref")" "$ref" >/dev/null
  echo "$ref"
done
