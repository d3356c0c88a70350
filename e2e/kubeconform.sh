#!/usr/bin/env bash
# e2e/kubeconform.sh: the chart's renders and deploy/'s plain manifests against the API schemas of
# each Kubernetes release below and the project's CRDs, strictly and offline (issue 33 item 7):
# a field a server does not know, a wrong type or a missing required field fails before any
# cluster sees it. Strict: a field the API server would silently drop is an error.
#   helm template of the chart with its default values (CRDs included) and with every optional
#   part on (e2e/testdata/chart-everything-on.values.yaml, shared with e2e/kube-score.sh);
#   deploy/manifests/*.yaml, deploy/namespace.yaml, deploy/samples/*.yaml.
# CI reaches the Go module proxy but not GitHub, so neither kubeconform's release binaries nor
# its published schema sets: kubeconform is built from its Go module, and the schemas are made
# by e2e/kube-schemas.py from each release's own swagger.json (in the k8s.io/kubernetes module)
# and charts/runner-manager/crds/, cached under $RM_CACHE/kube-schemas/<version> and made again
# when either changes. One summary line per release.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. e2e/control-plane/env.sh
die() { echo "kubeconform: $*" >&2; exit 1; }

KUBECONFORM_VERSION=0.8.0
# The oldest release the chart's optional ValidatingAdmissionPolicies (v1, GA in 1.30) serve, at
# its last patch, and the release `make test` runs on (RM_K8S_VERSION's default).
KUBE_VERSIONS=${RM_KUBECONFORM_VERSIONS:-"1.30.14 1.37.2"}
crds=(charts/runner-manager/crds/*.yaml)
# Every optional part of the chart on (shared with e2e/kube-score.sh).
everything_on=e2e/testdata/chart-everything-on.values.yaml

[ -x "$RM_TOOLS_BIN/helm" ] || e2e/control-plane/install-tools.sh >/dev/null
kc=$(e2e/go-tool.sh kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION")

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for v in $KUBE_VERSIONS; do
  # --kube-version: the templates choose APIs by it (policy/v1 PodDisruptionBudget, DaemonSet
  # maxSurge); --api-versions: `helm template` asks no server, and the ValidatingAdmissionPolicies
  # render only where that API is served (both releases here serve it).
  render=(helm template runner-manager charts/runner-manager --namespace runner-manager-system
    --kube-version "$v" --api-versions admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy)
  "${render[@]}" --include-crds > "$tmp/chart-default-$v.yaml" \
    || die "helm template of charts/runner-manager with its default values failed (Kubernetes $v)"
  "${render[@]}" -f "$everything_on" > "$tmp/chart-everything-on-$v.yaml" \
    || die "helm template of charts/runner-manager with every optional part on failed (Kubernetes $v): the values in $everything_on"

  dir=$RM_CACHE/kube-schemas/$v
  stamp="v$v $(cat e2e/kube-schemas.py "${crds[@]}" | sha256sum | cut -d' ' -f1)"
  if [ "$(cat "$dir/.stamp" 2>/dev/null)" != "$stamp" ]; then
    # A download into the Go module cache (kept for the next run), not a build.
    mod=$(cd / && go mod download -json "k8s.io/kubernetes@v$v") \
      || { echo "$mod" >&2; die "could not download the k8s.io/kubernetes v$v module from the Go module proxy (a real release? go env GOPROXY)"; }
    swagger=$(printf '%s\n' "$mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')/api/openapi-spec/swagger.json
    [ -f "$swagger" ] || die "the k8s.io/kubernetes v$v module has no api/openapi-spec/swagger.json ($swagger)"
    # Made beside and moved into place: an interrupted run never leaves a stamped partial set.
    rm -rf "$dir.new"
    python3 e2e/kube-schemas.py "$swagger" "${crds[@]}" "$dir.new" >/dev/null
    echo "$stamp" > "$dir.new/.stamp"
    rm -rf "$dir"; mv "$dir.new" "$dir"
  fi

  # -skip ServiceMonitor: it is the Prometheus Operator's CRD, which this project neither ships
  # nor can fetch offline; every other kind must have a schema (no -ignore-missing-schemas). A
  # schema kubeconform cannot compile reports as "could not find schema".
  if ! out=$("$kc" -strict -summary -output text -skip monitoring.coreos.com/v1/ServiceMonitor \
      -schema-location "$dir/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
      "$tmp/chart-default-$v.yaml" "$tmp/chart-everything-on-$v.yaml" \
      deploy/manifests/*.yaml deploy/namespace.yaml deploy/samples/*.yaml 2>&1); then
    printf '%s\n' "$out" >&2
    die "Kubernetes $v: the resources above do not conform (chart-*: charts/runner-manager rendered; fix the template or values, then e2e/render-manifests.sh for deploy/manifests)"
  fi
  echo "kubeconform, Kubernetes $v: $(printf '%s\n' "$out" | tail -1)"
done
