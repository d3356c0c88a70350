#!/usr/bin/env bash
# e2e/release.sh [VERSION [OUT]]: everything a team pins, for one version (`make release`).
#   OUT/images/<image>.tar      OCI layout archives (operator, node-agent, runner), reproducible
#   OUT/images/<image>.ref      NAME:VERSION and NAME@sha256:… of each
#   OUT/chart/runner-manager-VERSION.tgz, OUT/chart/index.yaml
#                               the packaged chart (`helm package`) whose values pin those
#                               images by digest, and a Helm repository index over it
#   OUT/manifests/runner-manager.yaml, OUT/manifests/{scalepolicies,runnerattempts}.yaml
#                               the plain manifests rendered from that packaged chart
#   OUT/CHANGELOG.md            the CHANGELOG's section for VERSION
#   OUT/SHA256SUMS              of every file above
# VERSION defaults to the workspace's (Cargo.toml); it must equal the chart's version and
# appVersion, and CHANGELOG.md must have a section naming it (`## [VERSION]`, or
# `## [Unreleased] — VERSION` before the release is cut); OUT defaults to dist/VERSION. Each
# mismatch is refused with the file to fix. The binaries are built with `cargo build --release
# --locked` (RM_RELEASE_PROFILE=debug takes target/debug's as they are: `make test` does, to
# check the packaging on the real node without a second build; RM_RELEASE_IMAGES=DIR takes the
# images already built from them there, the same bytes and digests). Pushing the images and
# the chart to registries is the publisher's step: `crane push OUT/images/operator.tar NAME:VERSION`,
# `helm push OUT/chart/runner-manager-VERSION.tgz oci://…` (the digests do not change).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. e2e/control-plane/env.sh
H() { "$RM_TOOLS_BIN/helm" "$@"; }
die() { echo "release: $*" >&2; exit 1; }

workspace=$(awk '/^\[workspace.package\]/ {w=1; next} /^\[/ {w=0} w && /^version *=/ {gsub(/[" ]/, "", $3); print $3; exit}' Cargo.toml)
version=${1:-$workspace}
out=${2:-dist/$version}
profile=${RM_RELEASE_PROFILE:-release}
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || die "version '$version' is not SemVer (MAJOR.MINOR.PATCH[-PRE])"
[ "$version" = "$workspace" ] || die "Cargo.toml's workspace version is $workspace, not $version: set [workspace.package] version"
chart_version=$(sed -n 's/^version: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/runner-manager/Chart.yaml)
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/runner-manager/Chart.yaml)
[ "$chart_version" = "$version" ] && [ "$app_version" = "$version" ] \
  || die "charts/runner-manager/Chart.yaml has version $chart_version and appVersion $app_version, not $version: set both"
# The CHANGELOG section: from its heading to the next `## `.
notes=$(awk -v v="$version" '
  /^## / { if (found) exit; if (index($0, "[" v "]") || ($0 ~ /^## \[Unreleased\]/ && index($0, v))) found = 1 }
  found' CHANGELOG.md)
[ -n "$notes" ] || die "CHANGELOG.md has no section for $version: add '## [$version] — $(date -u +%F)' (or '## [Unreleased] — $version')"
[ -x "$RM_TOOLS_BIN/helm" ] || e2e/control-plane/install-tools.sh >/dev/null

rm -rf "$out"
mkdir -p "$out/images" "$out/chart" "$out/manifests"

# --- images
if [ -n "${RM_RELEASE_IMAGES:-}" ]; then
  for i in operator node-agent runner; do
    [ -s "$RM_RELEASE_IMAGES/$i.tar" ] && [ -s "$RM_RELEASE_IMAGES/$i.ref" ] || die "no $i image in $RM_RELEASE_IMAGES"
    cp "$RM_RELEASE_IMAGES/$i.tar" "$RM_RELEASE_IMAGES/$i.ref" "$out/images/"
  done
else
  [ "$profile" = debug ] || cargo build --release --locked --workspace --bins
  RM_IMAGE_PROFILE=$profile RM_IMAGES="$out/images.all" e2e/images/build.sh >/dev/null
  for i in operator node-agent runner; do mv "$out/images.all/$i.tar" "$out/images.all/$i.ref" "$out/images/"; done
  rm -rf "$out/images.all"
fi
for i in operator node-agent runner; do
  ref=$(sed -n 1p "$out/images/$i.ref")
  [ "${ref##*:}" = "$version" ] || die "image $i is $ref, not tagged $version (e2e/images/build.sh tags the chart's appVersion)"
done
digest() { sed -n 2p "$out/images/$1.ref" | sed 's/.*@//'; }

# --- the chart, its image digests pinned in its values
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
cp -r charts/runner-manager "$stage/"
pin() { # KEY DIGEST: image.KEY.digest's default
  awk -v k="$1" -v d="$2" '
    /^[^ #]/ { i = ($0 ~ /^image:/); s = 0 }
    i && /^  [^ #]/ { s = ($0 ~ "^  " k ":") }
    s && /^    digest: ""/ { sub(/digest: ""/, "digest: \"" d "\""); done = 1 }
    { print }
    END { exit !done }' "$stage/runner-manager/values.yaml" > "$stage/values.yaml" \
    || die "charts/runner-manager/values.yaml: no empty image.$1.digest to pin"
  mv "$stage/values.yaml" "$stage/runner-manager/values.yaml"
}
pin operator "$(digest operator)"
pin nodeAgent "$(digest node-agent)"
H lint "$stage/runner-manager" >/dev/null || die "helm lint of the chart to package failed: helm lint charts/runner-manager"
H package "$stage/runner-manager" --version "$version" --app-version "$version" -d "$out/chart" >/dev/null
H repo index "$out/chart" >/dev/null
tgz=$out/chart/runner-manager-$version.tgz
[ -s "$tgz" ] || die "helm package wrote no $tgz"

# --- plain manifests from the packaged chart
H template runner-manager "$tgz" --namespace runner-manager-system | sed -e '/^ *helm.sh\/chart:/d' \
  > "$out/manifests/runner-manager.yaml"
cp charts/runner-manager/crds/*.yaml "$out/manifests/"
grep -q "$(digest operator)" "$out/manifests/runner-manager.yaml" || die "the rendered manifests do not pin the operator image"

printf '%s\n' "$notes" > "$out/CHANGELOG.md"
(cd "$out" && find . -type f ! -name SHA256SUMS | sort | xargs sha256sum > SHA256SUMS)
echo "release $version in $out:"
sed 's/^/  /' "$out/SHA256SUMS"
