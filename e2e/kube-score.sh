#!/usr/bin/env bash
# e2e/kube-score.sh: the chart's renders and deploy/'s plain manifests against kube-score's
# best-practice checks (issue 33 item 7), beside e2e/kubeconform.sh's schema check: what a valid
# manifest can still get wrong for production (no resource requests or memory limit, a writable
# root filesystem, a root or privileged container, no seccomp profile, probes missing or the same
# for readiness and liveness, a Service or NetworkPolicy selecting no pod, a deprecated API…).
#   helm template of the chart with its default values and with every optional part on
#   (e2e/testdata/chart-everything-on.values.yaml), for each Kubernetes release kubeconform checks;
#   deploy/manifests/*.yaml. Each set is scored on its own: kube-score matches Services,
#   NetworkPolicies and PodDisruptionBudgets to the pods of the same set.
# A CRITICAL or WARNING fails, unless the object waives that check with the annotation
# `kube-score/ignore: <check>,…`, each waiver with its reason in a comment beside it (the
# operator's Deployment and the agent's DaemonSet: charts/runner-manager/templates/). A waiver
# the object does not need (the check passes without it, or no such check) fails too, so the
# waivers stay the minimum. Not scored: kinds kube-score has no checks for (the CRDs, RBAC,
# webhooks, ValidatingAdmissionPolicies, ServiceMonitor, ConfigMaps; deploy/samples holds only
# ScalePolicies, so it is not passed).
# CI reaches the Go module proxy but not GitHub: kube-score is built from its Go module.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. e2e/control-plane/env.sh
die() { echo "kube-score: $*" >&2; exit 1; }

KUBE_SCORE_VERSION=1.20.0
# The releases e2e/kubeconform.sh checks (the templates choose APIs by the version).
KUBE_VERSIONS=${RM_KUBECONFORM_VERSIONS:-"1.30.14 1.37.2"}
everything_on=e2e/testdata/chart-everything-on.values.yaml
# The checks, beyond kube-score's defaults:
#  --ignore-container-cpu-limit: requests and a memory limit are required, a CPU limit is not
#    (a CPU limit throttles a burst the request already pays for; values.yaml says so for both
#    containers). A flag, not a waiver: the container-resources check still holds the rest.
#  the optional container-seccomp-profile (the operator's RuntimeDefault must stay) and
#  container-ports-check (port names and numbers).
opts=(--ignore-container-cpu-limit
  --enable-optional-test container-seccomp-profile --enable-optional-test container-ports-check)

[ -x "$RM_TOOLS_BIN/helm" ] || e2e/control-plane/install-tools.sh >/dev/null
ks=$(e2e/go-tool.sh kube-score github.com/zegl/kube-score/cmd/kube-score "$KUBE_SCORE_VERSION")

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
sets=() # NAME|KUBERNETES VERSION|FILE...
for v in $KUBE_VERSIONS; do
  render=(helm template runner-manager charts/runner-manager --namespace runner-manager-system
    --kube-version "$v" --api-versions admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy)
  "${render[@]}" > "$tmp/chart-default-$v.yaml" \
    || die "helm template of charts/runner-manager with its default values failed (Kubernetes $v)"
  "${render[@]}" -f "$everything_on" > "$tmp/chart-everything-on-$v.yaml" \
    || die "helm template of charts/runner-manager with every optional part on failed (Kubernetes $v): the values in $everything_on"
  sets+=("chart-default-$v|$v|$tmp/chart-default-$v.yaml" "chart-everything-on-$v|$v|$tmp/chart-everything-on-$v.yaml")
done
last=${KUBE_VERSIONS##* }
sets+=("deploy/manifests|$last|$(printf '%s|' deploy/manifests/*.yaml)")

# Each set twice: as is, and with the waivers off (--disable-ignore-checks-annotations), to find
# the waivers that waive nothing. kube-score exits 1 on a CRITICAL: the JSON decides, and output
# that is not JSON is an error.
args=()
for s in "${sets[@]}"; do
  IFS='|' read -r -a f <<<"$s"
  name=${f[0]}; v=${f[1]}; files=("${f[@]:2}")
  n=${#args[@]}
  for mode in waived all; do
    extra=(); [ "$mode" = all ] && extra=(--disable-ignore-checks-annotations)
    out=$tmp/$n-$mode.json
    "$ks" score "${opts[@]}" "${extra[@]}" --kubernetes-version "v${v%.*}" -o json "${files[@]}" \
      > "$out" 2> "$tmp/$n-$mode.err" || true
    python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$out" 2>/dev/null \
      || { cat "$tmp/$n-$mode.err" >&2; die "kube-score could not score $name (its error above)"; }
  done
  args+=("$name" "$tmp/$n-waived.json" "$tmp/$n-all.json")
done

# Per set: the findings (CRITICAL or WARNING, not waived) and the waivers that waive nothing, to
# stderr; the totals on stdout.
summary=$(python3 - "${args[@]}" <<'PY'
import json, sys

CRITICAL, WARNING = 1, 5
bad, objects, waived, waiving = [], 0, 0, set()
a = sys.argv[1:]
for name, waived_path, all_path in zip(a[0::3], a[1::3], a[2::3]):
    scored = json.load(open(waived_path)) or []
    unwaived = {o["object_name"]: o for o in json.load(open(all_path)) or []}
    objects += len(scored)
    for o in scored:
        kind, ref = o["type_meta"]["kind"], o["object_meta"]["name"]
        where = f"{name}: {kind} {ref}"
        for c in o["checks"]:
            if c["skipped"] or c["grade"] > WARNING:
                continue
            grade = "CRITICAL" if c["grade"] <= CRITICAL else "WARNING"
            notes = "; ".join(
                (f"({x['path']}) " if x.get("path") else "") + x["summary"]
                + (f": {x['description']}" if x.get("description") else "")
                for x in c.get("comments") or []) or c["check"]["comment"]
            bad.append(f"{where}: {c['check']['id']} {grade}: {notes}")
        ann = (o["object_meta"].get("annotations") or {}).get("kube-score/ignore", "")
        ids = [i.strip() for i in ann.split(",") if i.strip()]
        checks = {c["check"]["id"]: c for c in unwaived.get(o["object_name"], {}).get("checks", [])}
        for i in ids:
            c = checks.get(i)
            if c is None:
                bad.append(f"{where}: waives {i}, which is no check kube-score runs on it (misspelt?)")
            elif c["skipped"] or c["grade"] > WARNING:
                bad.append(f"{where}: waives {i}, which passes without the waiver: remove it from kube-score/ignore")
            else:
                waived += 1
                waiving.add((kind, ref))
for line in bad:
    print(line, file=sys.stderr)
print(len(bad), objects, waived, len(waiving))
PY
) || die "could not read kube-score's results"
read -r nbad objects waived waiving <<<"$summary"
[ "$nbad" = 0 ] || die "$nbad finding(s) above (chart-*: charts/runner-manager rendered): fix the template or values.yaml (then e2e/render-manifests.sh for deploy/manifests), or waive the check on the object with kube-score/ignore and a comment saying why"
echo "kube-score v$KUBE_SCORE_VERSION: $objects objects scored in ${#sets[@]} sets (the chart's default and everything-on renders for Kubernetes ${KUBE_VERSIONS// /, }; deploy/manifests), no CRITICAL or WARNING; $waived checks waived (kube-score/ignore, on $waiving objects across the sets); CPU limits not required"
