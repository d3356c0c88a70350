#!/usr/bin/env bash
# Runner pods and placeholder pods on the real node (issue 16): the chart installed with
# `nodeAgent.oci.enabled` into the cluster of e2e/cluster/start.sh, against the simulated GitHub
# (as e2e/cluster/helm-check.sh, which runs first and leaves nothing installed).
#   1. deploy/samples/oci-repo.yaml, its image replaced by the project's runner image
#      (e2e/images/build.sh, imported into the node's containerd, never pulled) by digest: its
#      idle runner is a pod of the node, a job runs on it, the attempt goes Preparing → Prepared
#      → JitReceived → Starting → Idle → Busy → … → Cleaned/CompletedJob and the pod is gone;
#   2. the runner pod deleted by someone else mid-job, then evicted mid-job (the Eviction API):
#      each attempt concludes in a closed outcome and its pod, runtime and registration go;
#   3. a policy with a 96Mi memory limit and a job that holds 512 MiB: the kernel OOM-kills it,
#      the attempt concludes in a closed outcome, nothing left; beside it a policy whose image
#      digest is in no containerd: Failed(ImageUnavailable) within the start deadline (30 s
#      here), no JIT minted for it, its pod gone;
#   4. placeholders: a native policy (2 idle runners, 400m CPU and 1Gi each) puts a placeholder
#      pod beside each runner; `kubectl describe node` counts their requests in its allocated
#      resources; an ordinary pod that does not fit beside them stays Pending (FailedScheduling,
#      Insufficient cpu) and is scheduled once the policy's runners are gone;
#   5. the JIT-leak scan: every JIT the simulated GitHub minted (its /_admin/jits) is searched
#      in every pod spec and event of the cluster, the containers' logs on the node
#      (/var/log/pods), the kubelet's, containerd's and the control plane's logs, the agent's and
#      the operator's logs: none appears;
#   6. helm uninstall: no pod, runtime directory, handoff file or registration left.
# After every step: each runtime directory belongs to a live attempt, each runner pod to a live
# OCI attempt, no handoff file, each registration to a live attempt, and every JIT minted is the
# journalled runner of the attempt its name derives from or was deregistered unused, none used
# twice (e2e/cluster/product.sh's jits_accounted: the simulated GitHub's /_admin/mints joined with
# a record of the attempts' journal). Each of these waits, bounded, for what it finds to settle:
# a runtime listed a moment before its attempt's Cleaned, or a minIdle replacement's JIT minted a
# moment before its journal write, is not a leak; what stays is (issue 27: a mint counter read at
# one instant against runner names a watch had logged by another failed a cold run).
# Prints the launch step timings (status.launch) of the OCI and native attempts and the
# kubelet's admission wait for the placeholders. Needs what helm-check.sh needs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/env.sh"
. "$here/product.sh"
export KUBECONFIG=${KUBECONFIG:-$RM_CLUSTER_RUN/kubeconfig}
K() { "$RM_TOOLS_BIN/kubectl" "$@"; }
H() { "$RM_TOOLS_BIN/helm" "$@"; }
N() { "$NODE_STATE/bin/nsexec" "$@"; }
ns=runner-manager-system rel=rm jobs_ns=rm-pods
HOST_ROOT=$NODE_FS/var/lib/runner-manager
work=$RM_CLUSTER_RUN/pods-check
t0=$(date +%s%N)
say() { local ms=$(( ($(date +%s%N) - t0) / 1000000 )); printf 'cluster/pods-check.sh [%d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*"; }
fail() {
  echo "cluster/pods-check.sh: FAIL: $*" >&2
  K -n $ns logs deploy/$rel-runner-manager-operator > "$work/operator.log" 2>&1 || true
  K -n $ns logs ds/$rel-runner-manager-node-agent > "$work/agent.log" 2>&1 || true
  K get pods -A -o wide >&2 || true
  K get sp,ra -n $jobs_ns -o wide >&2 || true
  K -n $ns logs deploy/$rel-runner-manager-operator --tail=25 >&2 2>&1 || true
  K -n $ns logs ds/$rel-runner-manager-node-agent --tail=40 >&2 2>&1 || true
  echo "simulated GitHub's log: $work/fake-github.log; attempt states: $work/states.log" >&2
  exit 1
}

imported=$'\n'$(N ctr -n k8s.io images ls -q)$'\n'
for i in operator node-agent runner pause; do
  [ -s "$RM_IMAGES/$i.ref" ] || { echo "cluster/pods-check.sh: no $i image: run e2e/images/build.sh before e2e/cluster/start.sh" >&2; exit 1; }
  case "$imported" in *$'\n'"$(sed -n 2p "$RM_IMAGES/$i.ref")"$'\n'*) ;;
    *) echo "cluster/pods-check.sh: $i image not in the node's containerd: e2e/cluster/load-images.sh" >&2; exit 1 ;;
  esac
done
runner_image=$(sed -n 2p "$RM_IMAGES/runner.ref")
# A digest of the runner's repository that no containerd holds (and the node has no registry).
absent_image=${runner_image%@*}@sha256:$(printf 'not-pulled' | sha256sum | cut -c1-64)

rm -rf "$work"; mkdir -p "$work"
fake_pid= watch_pid= pods_watch_pid= record_pid=
# Runners killed mid-job (their pod deleted or evicted): GitHub fails such a job once the runner
# stops answering and then removes the ephemeral registration; the simulated GitHub never gives
# up on a job, so their registrations stay there, busy, and are not counted as leaks.
abandoned=
cleanup() {
  [ -z "$watch_pid" ] || kill "$watch_pid" 2>/dev/null || true
  [ -z "$pods_watch_pid" ] || kill "$pods_watch_pid" 2>/dev/null || true
  stop_recording
  K -n default delete pod rm-pods-check-fit --wait=false >/dev/null 2>&1 || true
  drop_jobs_ns
  H uninstall $rel -n $ns >/dev/null 2>&1 || true
  [ -z "$fake_pid" ] || kill "$fake_pid" 2>/dev/null || true
}
trap cleanup EXIT
start_fake_github "$work" || fail "the simulated GitHub did not start"
github_app "$work"
admin GET jits >/dev/null && admin GET mints >/dev/null \
  || fail "the simulated GitHub does not list its JITs and mints (/_admin/jits, /_admin/mints): rebuild target/debug/fake-github"
say "simulated GitHub at $gh"

drop_jobs_ns
H uninstall $rel -n $ns >/dev/null 2>&1 || true
# Capacity 6, not 3: room for the next policy's runners while a deleted policy's attempts are
# still being cleaned (before 92752c6 the operator also kept them "expected" for 2 minutes).
tuning=(--set nodeAgent.capacity=6 --set nodeAgent.heartbeatSeconds=2 --set operator.resyncInterval=2s
  --set operator.observeInterval=5s --set admissionPolicy.enabled=true
  --set nodeAgent.oci.enabled=true --set nodeAgent.oci.startDeadlineSeconds=30)
install_product $rel $ns "${tuning[@]}" || fail "the operator or the node agent is not Ready"
say "helm install with nodeAgent.oci.enabled: operator and node agent Ready"
K create ns $jobs_ns >/dev/null
K -n $jobs_ns create secret generic github-app --from-literal=appId=4242 --from-file=privateKey="$work/app.pem" >/dev/null
# Every state every attempt passes through, in order, with its runner once registered (one line
# per watch event): attempts are deleted with their policy, the JITs minted are not.
K -n $jobs_ns get ra --watch -o jsonpath='{.metadata.name} {.status.state} {.status.runner.name}{"\n"}' > "$work/states.log" 2>/dev/null &
watch_pid=$!
# The attempts' journal for the JIT ledger (product.sh).
record_attempts $jobs_ns "$work/attempts.rec"
# Every runner and placeholder pod's phase as the watch sees it, with the local time (ms): the
# kubelet's admission and start of each, from its creation to Running.
K -n $jobs_ns get pods -l runner-manager.dev/pod-role --watch \
  -o jsonpath='{.metadata.name} {.status.phase} {.status.containerStatuses[0].state.terminated.reason}/{.status.containerStatuses[0].state.terminated.exitCode}{"\n"}' 2>/dev/null \
  > >(while read -r l; do echo "$(date +%s%3N) $l"; done > "$work/pods.log") &
pods_watch_pid=$!
# pod_start_ms SUFFIX: for each pod named *SUFFIX, milliseconds from its first event to Running.
pod_start_ms() {
  awk -v s="$1" '$2 ~ s"$" { if (!($2 in first)) first[$2] = $1; if ($3 == "Running" && !($2 in run)) run[$2] = $1 }
    END { for (p in run) printf "%d ", run[p] - first[p] }' "$work/pods.log"
}

attempts() { K -n $jobs_ns get ra -o json; }
# policy_attempts POLICY: the attempts of one policy (label runner-manager.dev/policy).
sel() { attempts | jq --arg p "$1" '[.items[] | select(.metadata.labels["runner-manager.dev/policy"] == $p)]'; }
state_of() { attempts | jq -r --arg n "$1" '.items[] | select(.metadata.name == $n) | "\(.status.state)/\(.status.outcome.kind // "")/\(.status.outcome.reason // "")"'; }
live_names() { attempts | jq -r '.items[] | select(.status.state != "Cleaned") | .metadata.name'; }
idle_of() { sel "$1" | jq -r '[.[] | select(.status.state == "Idle")][0].metadata.name // empty'; }
has_idle() { [ -n "$(idle_of "$1")" ]; }
job_status() { admin GET "jobs/$1" | jq -r .status; }
job_done() { [ "$(job_status "$1")" = completed ]; }
job_running() { [ "$(job_status "$1")" = in_progress ]; }
# A runtime removed while find walks it makes find fail: what it listed still counts.
handoffs() { { find "$HOST_ROOT" -name 'jit-*' -o -name '.jit-handoff' 2>/dev/null || true; N find /run /tmp -xdev -name 'jit-*' 2>/dev/null || true; } | sort -u; }
runner_pods() { K get pods -A -l runner-manager.dev/pod-role=runner -o json; }
pod_gone() { [ "$(K -n $jobs_ns get pods -l "runner-manager.dev/attempt=$1" -o name | wc -l)" = 0 ]; }
queue() { # REPO NAME BEHAVIOUR_JSON: a job on acme/REPO; prints its id
  admin POST jobs "$(jq -n --arg r "$1" --arg n "$2" --argjson b "$3" '{owner: "acme", repo: $r, labels: ["self-hosted", "linux"], name: $n, behaviour: $b}')" | jq -r .job_id
}
policy() { # NAME REPO MIN_IDLE EXECUTION_JSON
  jq -n --arg n "$1" --arg r "$2" --argjson m "$3" --argjson e "$4" '{apiVersion: "runner-manager.dev/v1alpha1", kind: "ScalePolicy",
    metadata: {name: $n}, spec: {github: {url: "https://github.com/acme/\($r)", credentialsSecretRef: {name: "github-app"}},
    labels: ["self-hosted", "linux", "x64"], minIdle: $m, maxRunners: 4, execution: $e, runner: {version: "latest"}}}' \
    | K -n $jobs_ns apply -f - >/dev/null
}
# stray_runtimes, stray_pods: the runtime directories and runner pods of no live attempt (what
# is on the node first, the attempts after: an attempt created in between is among them).
live_keys() { attempts | jq -r '.items[] | select(.status.state != "Cleaned") | .spec.id, .metadata.name, (.spec.id | gsub("-"; "") | .[0:12])'; }
stray_runtimes() {
  local dirs live d
  dirs=$(ls "$HOST_ROOT/runners" 2>/dev/null || true)
  live=$(live_keys)
  for d in $dirs; do grep -qxF -- "$d" <<<"$live" || echo "runners/$d"; done
}
stray_pods() {
  local pods live p name
  pods=$(runner_pods | jq -r '.items[] | "\(.metadata.labels["runner-manager.dev/attempt"]) \(.metadata.name)"')
  live=$(live_keys)
  while read -r p name; do
    [ -n "$p" ] || continue
    grep -qxF -- "$p" <<<"$live" || echo "pod $name (attempt $p)"
  done <<<"$pods"
}
# No leak: runtime directories, runner pods and registrations belong to live attempts; no
# handoff file; every JIT minted is journalled by its attempt or was deregistered unused. Each
# waits for what it finds to settle (an attempt cleaned a moment after the listing): a leak is
# what stays.
no_leaks() {
  local seen jits
  settle 30 "$1: runtime directories of no live attempt" stray_runtimes
  settle 30 "$1: runner pods of no live attempt" stray_pods
  # A starting runner's handoff is in flight until the helper in its pod takes it (polling every
  # 50 ms): a file is a leak when it stays.
  seen=$(handoffs)
  gone() { local f; for f in $seen; do [ ! -e "$f" ] && ! N test -e "$f" || return 1; done; }
  [ -z "$seen" ] || wait_for 15 "$1: JIT handoff files taken or removed: $(echo "$seen" | tr '\n' ' ')" gone
  jits=$(jits_accounted "$1" $jobs_ns "$work/attempts.rec")
  say "$1: no leak ($(runner_pods | jq '.items | length') runner pod(s), $(admin GET runners | jq length) registration(s), $jits, no handoff file)"
}
milli() { # a CPU quantity in millicores
  case "$1" in *m) echo "${1%m}" ;; '') echo 0 ;; *) echo $(( $1 * 1000 )) ;; esac
}

# --- 1. deploy/samples/oci-repo.yaml on the real node
sed -e "s#^\( *image: \).*@sha256:.*#\1$runner_image#" "$root/deploy/samples/oci-repo.yaml" > "$work/oci-repo.yaml"
grep -q "image: $runner_image" "$work/oci-repo.yaml" || fail "the sample's image was not replaced"
K -n $jobs_ns apply -f "$work/oci-repo.yaml" >/dev/null
wait_for 120 "an idle OCI runner of the sample" has_idle api-oci
first=$(idle_of api-oci)
pod=$(K -n $jobs_ns get pods -l "runner-manager.dev/attempt=$first,runner-manager.dev/pod-role=runner" -o json | jq '.items[0]')
[ "$(jq -r .spec.nodeName <<<"$pod")" = "$RM_CLUSTER_NODE" ] || fail "runner pod not on the node: $(jq -c .spec.nodeName <<<"$pod")"
[ "$(jq -r .status.phase <<<"$pod")" = Running ] || fail "runner pod of $first not Running"
[ "$(jq -r '.spec.containers[0].image' <<<"$pod")" = "$runner_image" ] || fail "runner pod image is not $runner_image"
[ "$(jq -r '.spec.automountServiceAccountToken' <<<"$pod")" = false ] || fail "runner pod mounts a service account token"
[ "$(jq -r '.spec.containers[0].resources.limits.cpu' <<<"$pod")" = 1500m ] || fail "runner pod lacks the sample's 1500m"
say "sample api-oci: idle runner $first is pod $(jq -r .metadata.name <<<"$pod") (uid $(jq -r .spec.securityContext.runAsUser <<<"$pod"), $runner_image) Running on $RM_CLUSTER_NODE"
job=$(queue api sample '{"duration_ms": 3000, "write_files": [{"path": "out.bin", "bytes": 4096}]}')
wait_for 120 "job $job completed" job_done "$job"
[ "$(admin GET "jobs/$job" | jq -r .conclusion)" = success ] || fail "job $job: $(admin GET "jobs/$job")"
ran=$(attempts | jq -r --arg r "$(admin GET "jobs/$job" | jq -r .runner_name)" '.items[] | select(.status.runner.name == $r) | .metadata.name')
[ -n "$ran" ] || fail "no attempt holds the runner of job $job"
cleaned_ok() { [ "$(state_of "$1")" = "Cleaned/CompletedJob/" ] || [ "$(state_of "$1")" = "Cleaned/CompletedJob/null" ]; }
wait_for 60 "attempt $ran Cleaned/CompletedJob" cleaned_ok "$ran"
wait_for 30 "the runner pod of $ran gone" pod_gone "$ran"
# The watch's log may lag behind the read that saw Cleaned.
watched_cleaned() { awk -v a="$ran" '$1 == a && $2 == "Cleaned" {f = 1} END {exit !f}' "$work/states.log"; }
wait_for 30 "the attempts' watch showing $ran Cleaned" watched_cleaned
# Its states in order, as the watch saw them (repeats folded).
path=$(awk -v a="$ran" '$1 == a && $2 != prev {printf "%s ", $2; prev = $2}' "$work/states.log")
for s in Preparing Prepared JitReceived Starting Busy Cleaned; do
  case " $path" in *" $s "*) ;; *) fail "attempt $ran never went through $s: $path" ;; esac
done
order=$(tr ' ' '\n' <<<"$path" | grep -nxE 'Preparing|Prepared|JitReceived|Starting|Busy|Cleaned' | awk -F: '!seen[$2]++ {printf "%s ", $2}')
[ "$order" = "Preparing Prepared JitReceived Starting Busy Cleaned " ] || fail "attempt $ran's states out of order: $path"
say "job $job ran on OCI runner $ran: $path→ pod gone"
oci_launch=$(attempts | jq -c --arg n "$ran" '.items[] | select(.metadata.name == $n) | .status.launch')
no_leaks "OCI job"

# --- 2. the runner pod deleted by someone else, then evicted, mid-job
closed() { # ATTEMPT: Cleaned with an outcome of the closed vocabulary (prints it)
  local s; s=$(state_of "$1")
  case "$s" in Cleaned/CompletedJob/*|Cleaned/Failed/?*|Cleaned/Orphaned/?*) echo "$s" ;; *) return 1 ;; esac
}
mid_job() { # HOW: a long job, its pod taken away by HOW (delete | evict)
  local how=$1 job ra p
  wait_for 120 "an idle OCI runner" has_idle api-oci
  job=$(queue api "$how" '{"duration_ms": 120000}')
  wait_for 60 "job $job running" job_running "$job"
  ra=$(attempts | jq -r --arg r "$(admin GET "jobs/$job" | jq -r .runner_name)" '.items[] | select(.status.runner.name == $r) | .metadata.name')
  busy() { [ "$(state_of "$ra" | cut -d/ -f1)" = Busy ]; }
  wait_for 30 "attempt $ra Busy" busy
  p=$ra-runner
  case $how in
    delete) K -n $jobs_ns delete pod "$p" --wait=false >/dev/null ;;
    evict) jq -n --arg n "$p" --arg ns $jobs_ns '{apiVersion: "policy/v1", kind: "Eviction", metadata: {name: $n, namespace: $ns}}' \
             | K create --raw "/api/v1/namespaces/$jobs_ns/pods/$p/eviction" -f - >/dev/null || fail "the Eviction API refused $p" ;;
  esac
  wait_for 120 "attempt $ra concluded and Cleaned after its pod was ${how%e}ed" closed "$ra"
  wait_for 30 "pod $p gone" pod_gone "$ra"
  abandoned+=" $(admin GET "jobs/$job" | jq -r .runner_name)"
  say "runner pod $p ${how%e}ed mid-job: attempt $(closed "$ra"), pod gone"
  no_leaks "pod ${how%e}ed"
}
mid_job delete
mid_job evict
K -n $jobs_ns delete scalepolicy api-oci --timeout=90s >/dev/null || fail "the sample policy was not deleted"

# --- 3. OOM-killed; an image that cannot be pulled
policy oom oom 1 '{"mode": "Oci", "image": "'"$runner_image"'", "resources": {"cpu": "250m", "memory": "96Mi"}}'
policy nopull nopull 1 '{"mode": "Oci", "image": "'"$absent_image"'", "resources": {"cpu": "100m", "memory": "64Mi"}}'
wait_for 120 "an idle runner of the 96Mi policy" has_idle oom
ooms_before=$(grep -c "TaskOOM" "$RM_CLUSTER_RUN/logs/containerd.log" || true)
job=$(queue oom hog '{"duration_ms": 20000, "allocate_mib": 512}')
wait_for 60 "job $job taken" job_running "$job"
ra=$(attempts | jq -r --arg r "$(admin GET "jobs/$job" | jq -r .runner_name)" '.items[] | select(.status.runner.name == $r) | .metadata.name')
wait_for 120 "attempt $ra concluded after its job outgrew 96Mi" closed "$ra"
wait_for 30 "job $job concluded" job_done "$job"
[ "$(admin GET "jobs/$job" | jq -r .conclusion)" = failure ] || fail "job $job was not failed by the OOM kill: $(admin GET "jobs/$job")"
wait_for 30 "pod $ra-runner gone" pod_gone "$ra"
oom_evidence=$(( $(grep -c "TaskOOM" "$RM_CLUSTER_RUN/logs/containerd.log" || true) - ooms_before ))
# The pods' watch may lag behind the read that saw the pod gone.
watched_end() { awk -v p="$ra-runner" '$2 == p && $4 != "/" {f = 1} END {exit !f}' "$work/pods.log"; }
wait_for 30 "the pods' watch showing how pod $ra-runner's container ended" watched_end
ended=$(awk -v p="$ra-runner" '$2 == p && $4 != "/" {print $4}' "$work/pods.log" | sort -u | tr '\n' ' ')
# The kubelet reports the container OOMKilled (containerd saw the cgroup's OOM event; the
# listener itself exited 0 after reporting the failed job).
case "$ended" in *OOMKilled/*) ;; *) fail "the 96Mi runner pod's container did not end OOMKilled: ${ended:-unseen}" ;; esac
[ "$oom_evidence" -ge 1 ] || fail "containerd saw no OOM kill (TaskOOM) in the 96Mi runner pod"
say "job $job holding 512 MiB under a 96Mi limit: the kernel OOM-killed its worker (containerd: $oom_evidence TaskOOM; the pod's container ended ${ended:-unseen}), job failed, attempt $(closed "$ra"), pod gone"
oldest_nopull() { sel nopull | jq -r 'sort_by(.metadata.creationTimestamp) | .[0].metadata.name // empty'; }
has_nopull() { [ -n "$(oldest_nopull)" ]; }
wait_for 30 "an attempt of the unpullable policy" has_nopull
np=$(oldest_nopull)
unpulled() { [ "$(state_of "$np")" = Cleaned/Failed/ImageUnavailable ]; }
wait_for 90 "attempt $np Failed(ImageUnavailable)" unpulled
np_json=$(attempts | jq --arg n "$np" '.items[] | select(.metadata.name == $n)')
[ "$(jq -r '.status.runner.name // ""' <<<"$np_json")" = "" ] || fail "attempt $np registered a runner with an unpullable image"
[ "$(admin GET mints | jq --arg n "runner-manager-$(jq -r .spec.id <<<"$np_json")" '[.[] | select(.name == $n)] | length')" = 0 ] \
  || fail "a JIT was minted for attempt $np, whose image no containerd holds"
wait_for 30 "pod $np-runner gone" pod_gone "$np"
pull_events=$(K -n $jobs_ns get events -o json | jq -r --arg p "$np-runner" '[.items[] | select(.involvedObject.name == $p) | .reason] | unique | join(",")')
say "image $absent_image: attempt $np Failed(ImageUnavailable) (kubelet: $pull_events), no runner registered, pod gone"
K -n $jobs_ns delete scalepolicy oom nopull --timeout=90s >/dev/null || fail "the policies were not deleted"
no_live() { [ -z "$(live_names)" ]; }
wait_for 90 "no live attempt" no_live
no_leaks "OOM and unpullable image"

# --- 4. placeholders: the scheduler counts native runners
policy native native 2 '{"mode": "Native", "resources": {"cpu": "400m", "memory": "1Gi"}}'
two_idle() { [ "$(sel native | jq '[.[] | select(.status.state == "Idle")] | length')" = 2 ]; }
wait_for 120 "two idle native runners" two_idle
placeholders=$(K -n $jobs_ns get pods -l runner-manager.dev/pod-role=placeholder -o json)
[ "$(jq '[.items[] | select(.status.phase == "Running")] | length' <<<"$placeholders")" = 2 ] \
  || fail "not two running placeholder pods: $(jq -c '[.items[] | {n: .metadata.name, p: .status.phase}]' <<<"$placeholders")"
described=$(K describe node "$RM_CLUSTER_NODE")
for p in $(jq -r '.items[].metadata.name' <<<"$placeholders"); do
  grep -qE "^ +$jobs_ns +$p +400m \([0-9]+%\) +0 \(0%\) +1Gi " <<<"$described" \
    || fail "kubectl describe node does not list placeholder $p with 400m/1Gi requested: $(grep -A12 'Non-terminated Pods' <<<"$described")"
done
# The node's total requests: what describe says equals the sum over its pods, placeholders in.
sum=0
for q in $(K get pods -A --field-selector "spec.nodeName=$RM_CLUSTER_NODE,status.phase!=Succeeded,status.phase!=Failed" -o json \
  | jq -r '.items[].spec.containers[].resources.requests.cpu // "0"'); do sum=$(( sum + $(milli "$q") )); done
allocated=$(awk '/^Allocated resources:/ {a=1} a && $1 == "cpu" {print $2; exit}' <<<"$described")
[ "$(milli "$allocated")" = "$sum" ] && [ "$sum" -ge 800 ] \
  || fail "describe node allocates $allocated of CPU, the node's pods request ${sum}m (with 2 x 400m of placeholders)"
say "kubectl describe node: 2 placeholders of 400m/1Gi listed, allocated cpu $allocated = the pods' requests (placeholders in)"
# An ordinary pod that fits only without the runners.
alloc=$(milli "$(K get node "$RM_CLUSTER_NODE" -o jsonpath='{.status.allocatable.cpu}')")
want=$(( alloc - sum + 800 - 100 ))
[ $want -gt $(( alloc - sum )) ] || fail "no room to test: allocatable ${alloc}m, requested ${sum}m"
K -n default apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: rm-pods-check-fit}
spec:
  containers: [{name: c, image: "$(sed -n 1p "$RM_IMAGES/pause.ref")", imagePullPolicy: Never, resources: {requests: {cpu: ${want}m}}}]
YAML
refused() {
  K -n default get events --field-selector involvedObject.name=rm-pods-check-fit,reason=FailedScheduling -o json \
    | jq -e '[.items[] | select(.message | test("Insufficient cpu"))] | length > 0'
}
wait_for 60 "FailedScheduling (Insufficient cpu) of a ${want}m pod beside the runners" refused
[ "$(K -n default get pod rm-pods-check-fit -o jsonpath='{.status.phase}')" = Pending ] || fail "the ${want}m pod is not Pending"
say "a ${want}m pod stays Pending beside the runners: FailedScheduling, Insufficient cpu"
native_launch=$(sel native | jq -c '[.[] | .status.launch]')
K -n $jobs_ns delete scalepolicy native --timeout=90s >/dev/null || fail "the native policy was not deleted"
fits() { [ "$(K -n default get pod rm-pods-check-fit -o jsonpath='{.status.phase}')" = Running ]; }
wait_for 90 "the ${want}m pod scheduled and running once the runners are gone" fits
no_placeholders() { [ "$(K -n $jobs_ns get pods -l runner-manager.dev/pod-role=placeholder -o name | wc -l)" = 0 ]; }
wait_for 30 "no placeholder left" no_placeholders
K -n default delete pod rm-pods-check-fit --wait=true >/dev/null
say "native runners gone: the ${want}m pod scheduled and ran; no placeholder left"
no_leaks "placeholders"

# --- 5. the JIT-leak scan
admin GET jits | jq -r '.[]' > "$work/jits"
njit=$(grep -c . "$work/jits" || true)
[ "$njit" -ge 3 ] || fail "only $njit JITs minted: the scan would prove nothing"
{
  K get pods -A -o yaml
  K get events -A -o yaml
  K get ra -A -o yaml
  K -n $ns logs ds/$rel-runner-manager-node-agent --all-containers
  K -n $ns logs deploy/$rel-runner-manager-operator --all-containers
} > "$work/scan.txt" 2>&1
# The node's /var/log: the containers' logs (/var/log/pods, /var/log/containers), its journal.
scanned=("$work/scan.txt" "$NODE_FS/var/log" "$RM_CLUSTER_RUN/logs" "$CP_RUN")
# jit_hits NEEDLE: where NEEDLE appears (files, and "the pod specs, events, attempts or logs").
jit_hits() {
  grep -rlF -- "$1" "${scanned[@]}" 2>/dev/null | grep -v "/pods-check/" || true
  if grep -qF -- "$1" "$work/scan.txt"; then echo "the pod specs, events, attempts or the agent's or operator's log"; fi
}
# The scan finds what it looks for: a JIT slice planted in the node's /var/log is found.
canary=$NODE_FS/var/log/rm-pods-check-canary.log
first_jit=$(head -1 "$work/jits")
printf 'a line with %s in it\n' "${first_jit:40:32}" > "$canary"
found=$(jit_hits "${first_jit:40:32}")
rm -f "$canary"
[ "$found" = "$canary" ] || fail "the JIT-leak scan did not find a JIT slice planted in $canary (found: $found)"
while read -r jit; do
  # The whole JIT and a slice of it (a JIT cut by a log line's length; its start is the base64
  # of a JSON prefix every JIT shares).
  for needle in "$jit" "${jit:40:32}"; do
    hit=$(jit_hits "$needle")
    [ -z "$hit" ] || fail "a JIT minted by the simulated GitHub appears in: $hit"
  done
done < "$work/jits"
say "JIT-leak scan: $njit JITs in none of: pod specs, events, attempts, agent/operator logs, /var/log/pods, kubelet/containerd/control plane logs ($(du -sh "$NODE_FS/var/log/pods" | cut -f1) of container logs)"

# --- timings
echo "launch steps (status.launch, ms), real node; OCI: $oci_launch; native (with its placeholder): $native_launch"
echo "placeholders: creation to Running (ms, as a watch saw them): $(pod_start_ms -placeholder)"
echo "runner pods (OCI): creation to Running (ms, as a watch saw them): $(pod_start_ms -runner)"

# --- 6. helm uninstall
kill "$watch_pid" "$pods_watch_pid" 2>/dev/null || true; watch_pid= pods_watch_pid=
drop_jobs_ns
# Every attempt gone with its namespace: every JIT ever minted is journalled or deregistered, and
# no registration is left but the killed runners' (before uninstall, while the operator runs).
jits=$(jits_accounted "namespace deleted" $jobs_ns "$work/attempts.rec")
say "namespace $jobs_ns deleted: $jits"
stop_recording
H uninstall $rel -n $ns >/dev/null
no_pods() { [ -z "$(K -n $ns get pods -o name 2>/dev/null)" ] && [ "$(runner_pods | jq '.items | length')" = 0 ]; }
wait_for 60 "no pod after helm uninstall" no_pods
# The agent removes a runtime after its attempt's finalizer is gone: it may still be at it.
# Dot entries too: an overlay's workdir (.overlay-work/<id>) goes with its runtime and the probe's
# (.overlay-probe-*) at once, so nothing of the agent's may stay after uninstall.
no_runtimes() { [ -z "$(ls -A "$HOST_ROOT/runners" 2>/dev/null)" ]; }
wait_for 30 "no runtime directory left after helm uninstall" no_runtimes
left=$(admin GET runners | jq -r --arg a "$abandoned" '.[] | select(.name as $n | ($a | split(" ") | index($n)) | not) | .name')
[ -z "$left" ] || fail "registrations left on the simulated GitHub: $left"
# A file seen while the uninstall's last removal runs is not a leak; one that stays is (a one-shot
# look once failed CI naming no file: it was gone by the second look).
settle 15 "JIT handoff files left after helm uninstall" handoffs
say "helm uninstall: no pod, runtime directory, registration or handoff file left"
echo "cluster/pods-check.sh: all checks passed"
