#!/usr/bin/env bash
# Builds the project's container images from the workspace's binaries, with no registry and no
# build tool: a minimal root filesystem per image (the binaries, the shared libraries they load,
# the CA bundle, a passwd/group with the image's user) written into an OCI layout archive by
# mkimage.sh. The images are named as the chart's defaults name them (values.yaml repository,
# Chart.yaml appVersion), so the same names work here and with a registry; the chart references
# them by digest.
#
#   operator        runner-manager-operator                          user 65532
#   node-agent      runner-manager-node-agent, runner-manager-runner-entry (/usr/bin, where the
#                   systemd launcher looks), systemd-run and systemctl (Debian's)  user 0
#   standin-runner  the e2e stand-in runner listener (e2e/src/bin/standin-runner-listener.rs)
#   runner          the OCI runner image (docs/oci.md): the entry helper at
#                   /usr/local/bin/runner-manager-runner-entry, where the agent's runner pods run
#                   it, and the shared libraries the stand-in listener loads (the listener itself
#                   comes in the runner package the agent mounts from the host); users build
#                   theirs with GitHub's runner from deploy/runner-image/Containerfile
#
# Out: $RM_IMAGES/<image>.tar and $RM_IMAGES/<image>.ref (NAME:TAG and NAME@sha256:...).
# Skips an image whose inputs are unchanged. The binaries come from target/$RM_IMAGE_PROFILE
# (debug: what `cargo build --workspace --bins` makes; debug info stripped in the image).
# RM_IMAGE_VARIANT=WORD adds /etc/runner-manager/image-variant (WORD) to every image: the same
# binaries under another digest, for an upgrade test (e2e/cluster/helm-check.sh) — write those
# into another RM_IMAGES.
# Containerfiles for users with their own tooling: images/<image>/Containerfile.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/e2e/control-plane/env.sh"
OUTDIR=${RM_IMAGES:-$RM_CACHE/images}
PROFILE=${RM_IMAGE_PROFILE:-debug}
T=$root/target/$PROFILE
mkdir -p "$OUTDIR"

app=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$root/charts/runner-manager/Chart.yaml")
repo() { # the chart's default repository for values key $1 (image.<key>.repository)
  awk -v k="$1" '/^image:/ {i=1; next} i && /^[^ ]/ {i=0} i && $0 ~ "^  "k":" {s=1; next}
    s && /^  [^ ]/ {s=0} s && /repository:/ {print $2; exit}' "$root/charts/runner-manager/values.yaml"
}
OPERATOR_REPO=$(repo operator); AGENT_REPO=$(repo nodeAgent)
[ -n "$app" ] && [ -n "$OPERATOR_REPO" ] && [ -n "$AGENT_REPO" ] \
  || { echo "images/build.sh: cannot read the chart's image names" >&2; exit 1; }
STANDIN_REPO=${OPERATOR_REPO%/*}/standin-runner
RUNNER_REPO=${OPERATOR_REPO%/*}/runner

# copy_bin ROOTFS DEST SRC: SRC at DEST, without debug info, plus every shared library it loads.
copy_bin() {
  local r=$1 dest=$2 src=$3 l
  mkdir -p "$r$(dirname "$dest")"
  objcopy --strip-debug "$src" "$r$dest"
  for l in $(ldd "$src" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
    [ -e "$r$l" ] || cp -L --parents "$l" "$r/"
  done
}
base() { # ROOTFS USER: directories, CA bundle, passwd/group, an empty writable /tmp
  local r=$1 uid=$2
  mkdir -p "$r/etc/ssl/certs" "$r/tmp" "$r/usr/bin" "$r/usr/lib" "$r/var/lib"
  chmod 1777 "$r/tmp"
  cp -L /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$r/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$r/etc/group"
  [ "$uid" = 0 ] || { mkdir -p "$r/home/nonroot"; chown "$uid:$uid" "$r/home/nonroot"; }
  if [ -n "${RM_IMAGE_VARIANT:-}" ]; then
    mkdir -p "$r/etc/runner-manager"; echo "$RM_IMAGE_VARIANT" > "$r/etc/runner-manager/image-variant"
  fi
}

# image NAME REPO USER ENTRYPOINT DEST=SRC...
image() {
  local name=$1 repo=$2 ref=$2:$app user=$3 entry=$4; shift 4
  local stamp pair inputs="" r digest
  for pair in "$@"; do
    [ -f "${pair#*=}" ] || { echo "images/build.sh: missing ${pair#*=} (cargo build --workspace --bins)" >&2; exit 1; }
    inputs+="${pair%%=*} $(stat -c '%s %Y' "${pair#*=}") ${pair#*=}"$'\n'
  done
  stamp=$(printf '%s\n%s %s %s %s\n' "$inputs" "$ref" "$user" "$entry${RM_IMAGE_VARIANT:+ variant $RM_IMAGE_VARIANT}" "$(sha256sum "$0" "$(dirname "$0")/mkimage.sh" | cut -c1-16)" | sha256sum | cut -c1-32)
  if [ -f "$OUTDIR/$name.tar" ] && [ "$(cat "$OUTDIR/$name.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "$name: unchanged ($(sed -n 2p "$OUTDIR/$name.ref"))"; return
  fi
  r=$(mktemp -d "$OUTDIR/.rootfs-$name.XXXXXX")
  base "$r" "$user"
  for pair in "$@"; do copy_bin "$r" "${pair%%=*}" "${pair#*=}"; done
  digest=$("$(dirname "$0")/mkimage.sh" "$ref" "$r" "$OUTDIR/$name.tar" "$entry" null "$user")
  rm -rf "$r"
  printf '%s\n%s@%s\n' "$ref" "$repo" "$digest" > "$OUTDIR/$name.ref"
  echo "$stamp" > "$OUTDIR/$name.stamp"
  echo "$name: $repo@$digest ($(du -h "$OUTDIR/$name.tar" | cut -f1))"
}

image operator "$OPERATOR_REPO" 65532 '["/usr/bin/runner-manager-operator"]' \
  "/usr/bin/runner-manager-operator=$T/runner-manager-operator"
image node-agent "$AGENT_REPO" 0 '["/usr/bin/runner-manager-node-agent"]' \
  "/usr/bin/runner-manager-node-agent=$T/runner-manager-node-agent" \
  "/usr/bin/runner-manager-runner-entry=$T/runner-manager-runner-entry" \
  "/usr/bin/systemd-run=$(command -v systemd-run)" "/usr/bin/systemctl=$(command -v systemctl)"
image standin-runner "$STANDIN_REPO" 65532 '["/usr/bin/standin-runner-listener"]' \
  "/usr/bin/standin-runner-listener=$T/standin-runner-listener"
image runner "$RUNNER_REPO" 65532 '["/usr/local/bin/runner-manager-runner-entry"]' \
  "/usr/local/bin/runner-manager-runner-entry=$T/runner-manager-runner-entry" \
  "/usr/bin/standin-runner-listener=$T/standin-runner-listener"
