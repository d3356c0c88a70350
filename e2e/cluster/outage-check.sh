#!/usr/bin/env bash
# Outages on the real node (issue 27, items 3 and 4): the chart installed with its defaults (the
# admission webhook `failurePolicy: Fail`, one operator replica, heartbeats of 10 s, the native
# execution: runners as units of the node's systemd) into the cluster of e2e/cluster/start.sh,
# against the simulated GitHub (as e2e/cluster/helm-check.sh, which leaves nothing installed).
#   1. Every operator replica down for RM_OUTAGE_SECONDS (default 300): three runners busy with
#      jobs, the operator Deployment scaled to zero, its pods gone (no replica serves the webhook
#      or the broker); the jobs end during the outage and their runners exit; the Deployment
#      scaled back. Then: every attempt the outage held is Cleaned within RM_OUTAGE_CLEAN_BOUND
#      seconds of the operator's return (the time taken is printed); no node counted lost (no
#      attempt Orphaned(NodeLost), no NodeLost Event, the agent's Lease renewed again, the Node
#      Ready throughout); no runner started twice (each runner's unit kept its InvocationID while
#      it ran, each JIT opened one session, each attempt journalled one runner); the agents'
#      failed writes during the outage counted from the API server's
#      apiserver_admission_webhook_rejection_count for the product's two webhooks (the agent's
#      own lease_renewals_total{outcome="failed"} and reconcile_errors_total beside them) and
#      bounded by what the agent's retry cadence allows (a renewal per heartbeat, a journal write
#      per attempt at most every supervision backoff): the count and the rate are printed.
#   2. The API server restarted (the control plane's kube-apiserver stopped by its pid, down for
#      RM_APISERVER_DOWN_SECONDS, default 30, started again with the same command line) while
#      three runners run jobs: the agent re-converges without a restart of its own (same pod,
#      restartCount unchanged), its Lease is renewed again, the units are not restarted, the
#      jobs complete, their attempts are Cleaned (the time taken is printed).
# After each: no unit, runtime directory or registration of no live attempt, and every JIT minted
# is journalled by its attempt or was deregistered unused (product.sh's jits_accounted); at the
# end the policy deleted and `helm uninstall`: nothing left.
# Needs what helm-check.sh needs; KUBECONFIG of that cluster (default $RM_CLUSTER_RUN/kubeconfig).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
. "$here/product.sh"
export KUBECONFIG=${KUBECONFIG:-$RM_CLUSTER_RUN/kubeconfig}
K() { "$RM_TOOLS_BIN/kubectl" "$@"; }
H() { "$RM_TOOLS_BIN/helm" "$@"; }
N() { "$NODE_STATE/bin/nsexec" "$@"; }
ns=runner-manager-system rel=rm jobs_ns=rm-outage
HOST_ROOT=$NODE_FS/var/lib/runner-manager
work=$RM_CLUSTER_RUN/outage-check
outage=${RM_OUTAGE_SECONDS:-300}
clean_bound=${RM_OUTAGE_CLEAN_BOUND:-120}
api_down=${RM_APISERVER_DOWN_SECONDS:-30}
busy_n=3
t0=$(date +%s%N)
say() { local ms=$(( ($(date +%s%N) - t0) / 1000000 )); printf 'cluster/outage-check.sh [%d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*"; }
fail() {
  echo "cluster/outage-check.sh: FAIL: $*" >&2
  K -n $ns logs deploy/$rel-runner-manager-operator > "$work/operator.log" 2>&1 || true
  K -n $ns logs ds/$rel-runner-manager-node-agent > "$work/agent.log" 2>&1 || true
  K get pods -A -o wide >&2 || true
  K get sp,ra -n $jobs_ns -o wide >&2 || true
  K -n $ns logs deploy/$rel-runner-manager-operator --tail=25 >&2 2>&1 || true
  K -n $ns logs ds/$rel-runner-manager-node-agent --tail=40 >&2 2>&1 || true
  N systemctl list-units --all --no-legend 'rm-*' >&2 || true
  echo "simulated GitHub's log: $work/fake-github.log; attempts: $work/attempts.rec; logs: $work" >&2
  exit 1
}
case "$outage$clean_bound$api_down" in *[!0-9]*) echo "cluster/outage-check.sh: RM_OUTAGE_SECONDS, RM_OUTAGE_CLEAN_BOUND and RM_APISERVER_DOWN_SECONDS are whole seconds" >&2; exit 2 ;; esac
[ "$outage" -ge 30 ] || { echo "cluster/outage-check.sh: RM_OUTAGE_SECONDS must be at least 30 (three heartbeats: the agent's Lease must expire)" >&2; exit 2; }

imported=$'\n'$(N ctr -n k8s.io images ls -q)$'\n'
for i in operator node-agent pause; do
  [ -s "$RM_IMAGES/$i.ref" ] || { echo "cluster/outage-check.sh: no $i image: run e2e/images/build.sh before e2e/cluster/start.sh" >&2; exit 1; }
  case "$imported" in *$'\n'"$(sed -n 2p "$RM_IMAGES/$i.ref")"$'\n'*) ;;
    *) echo "cluster/outage-check.sh: $i image not in the node's containerd: e2e/cluster/load-images.sh" >&2; exit 1 ;;
  esac
done

rm -rf "$work"; mkdir -p "$work"
fake_pid= record_pid= api_stopped=
cleanup() {
  # An API server this script stopped is started again before anything else.
  [ -z "$api_stopped" ] || start_apiserver || true
  stop_recording
  K -n $ns scale deploy/$rel-runner-manager-operator --replicas=1 >/dev/null 2>&1 || true
  drop_jobs_ns
  H uninstall $rel -n $ns >/dev/null 2>&1 || true
  [ -z "$fake_pid" ] || kill "$fake_pid" 2>/dev/null || true
}
trap cleanup EXIT
start_fake_github "$work" || fail "the simulated GitHub did not start"
github_app "$work"
admin GET mints >/dev/null || fail "the simulated GitHub does not list its mints (/_admin/mints): rebuild target/debug/fake-github"
say "simulated GitHub at $gh"

drop_jobs_ns
H uninstall $rel -n $ns >/dev/null 2>&1 || true
# The product's defaults (heartbeat 10 s, observe 30 s, resync 10 s, node-lost grace 10 m, one
# replica): what an outage costs a real install.
install_product $rel $ns --set "placeholders.image=$(sed -n 1p "$RM_IMAGES/pause.ref")" \
  || fail "the operator or the node agent is not Ready"
heartbeat=$(K -n $ns get ds/$rel-runner-manager-node-agent -o json \
  | jq -r '[.spec.template.spec.containers[0].env[] | select(.name == "RM_HEARTBEAT_SECONDS") | .value][0] // ""')
case "$heartbeat" in ''|*[!0-9]*|0) fail "the agent's RM_HEARTBEAT_SECONDS is '$heartbeat'" ;; esac
say "helm install with the chart's defaults: operator and node agent Ready (heartbeat ${heartbeat}s)"

attempts() { K -n $jobs_ns get ra -o json; }
live_ids() { attempts | jq -r '.items[] | select(.status.state != "Cleaned") | .spec.id'; }
unit_of() { echo "rm-$(echo "$1" | tr -d - | cut -c1-12).service"; }
units() { N systemctl list-units --all --plain --no-legend 'rm-*.service' | awk '{print $1}' | sort; }
count_in() { attempts | jq --arg s "$1" '[.items[] | select(.status.state == $s)] | length'; }
job_done() { [ "$(admin GET "jobs/$1" | jq -r .status)" = completed ]; }
agent_pod_json() { K -n $ns get pods -l app.kubernetes.io/component=node-agent -o json | jq '.items[0]'; }
agent_metrics() { N curl -fsS --max-time 5 "http://$(agent_pod_json | jq -r .status.podIP):9090/metrics"; }
# prom_sum TEXT REGEX: the sum of the samples whose `name{labels}` matches REGEX.
prom_sum() { awk -v re="$2" '$1 !~ /^#/ && $1 ~ re {s += $2} END {printf "%d\n", s}' <<<"$1"; }
webhook_rejections() { prom_sum "$1" '^apiserver_admission_webhook_rejection_count\{.*name="(leases|runnerattempts)\.runner-manager\.dev"'; }
webhook_calls() { prom_sum "$1" '^apiserver_admission_webhook_request_total\{.*name="(leases|runnerattempts)\.runner-manager\.dev"'; }
lease_renewed_at() { K -n $ns get lease "runner-manager-agent-$RM_CLUSTER_NODE" -o jsonpath='{.spec.renewTime}'; }
node_ready() { [ "$(K get node "$RM_CLUSTER_NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
ms_of() { date -d "$1" +%s%3N; }
now_ms() { date +%s%3N; }

# What belongs to no live attempt (settle waits for none): units and runtime directories listed
# first, the live attempts after (an attempt created in between is among them).
stray_units() {
  local now want u
  now=$(units); want=$(for id in $(live_ids); do unit_of "$id"; done)
  for u in $now; do grep -qxF -- "$u" <<<"$want" || echo "unit $u"; done
}
stray_dirs() {
  local dirs want d
  dirs=$(ls "$HOST_ROOT/runners" 2>/dev/null || true); want=$(for id in $(live_ids); do unit_of "$id"; done)
  for d in $dirs; do grep -qxF -- "rm-$d.service" <<<"$want" || echo "runtime directory runners/$d"; done
}
no_leaks() {
  local jits
  settle 60 "$1: units of no live attempt" stray_units
  settle 60 "$1: runtime directories of no live attempt" stray_dirs
  jits=$(jits_accounted "$1" $jobs_ns "$work/attempts.rec" 120)
  say "$1: no leak ($(units | grep -c . || true) unit(s), $(admin GET runners | jq length) registration(s), $jits)"
}
# No node counted lost: no attempt Orphaned(NodeLost), no NodeLost Event in the jobs namespace.
no_node_lost() {
  local lost events
  lost=$(attempts | jq -r '[.items[] | select(.status.outcome.kind == "Orphaned") | "\(.metadata.name) Orphaned(\(.status.outcome.reason))"] | join(" ")')
  [ -z "$lost" ] || fail "$1: attempts orphaned: $lost"
  events=$(K -n $jobs_ns get events --field-selector reason=NodeLost -o name 2>/dev/null | wc -l)
  [ "$events" = 0 ] || fail "$1: $events NodeLost Event(s): $(K -n $jobs_ns get events --field-selector reason=NodeLost 2>&1 | tail -3)"
}

# Busy runners: three jobs on three runners, each the unit of an attempt. Prints the job ids;
# sets busy_ids (attempt uuids) and the units' InvocationIDs in invocations (unit=id lines).
take_jobs() { # DURATION_MS NAME
  local i
  queued=()
  for i in $(seq 1 $busy_n); do queued+=("$(queue_job "$2-$i" "$1")"); done
  all_busy() { [ "$(count_in Busy)" -ge $busy_n ]; }
  wait_for 180 "$busy_n runners Busy with the $2 jobs" all_busy
  busy_ids=$(attempts | jq -r '.items[] | select(.status.state == "Busy") | .spec.id')
  invocations=
  for id in $busy_ids; do
    inv=$(N systemctl show -P InvocationID "$(unit_of "$id")")
    [ -n "$inv" ] || fail "the busy runner $(unit_of "$id") has no InvocationID (not running in the node's systemd)"
    invocations+="$(unit_of "$id")=$inv"$'\n'
  done
}
# units_kept: each busy runner's unit either stopped or still the invocation it started as.
units_kept() {
  local u inv now
  while IFS== read -r u inv; do
    [ -n "$u" ] || continue
    now=$(N systemctl show -P InvocationID "$u" 2>/dev/null || true)
    [ -z "$now" ] || [ "$now" = "$inv" ] || fail "$1: runner unit $u was started again (InvocationID $inv, now $now)"
  done <<<"$invocations"
}
# cleaned_within STARTED_MS WHAT: waits until every attempt of busy_ids is Cleaned; prints the
# seconds from STARTED_MS to the last Cleaned (the attempts' cleanedAt, as the API server has it).
cleaned_within() {
  local from=$1 what=$2 last=0 id at
  all_cleaned() {
    local id
    for id in $busy_ids; do
      [ "$(attempts | jq -r --arg id "$id" '.items[] | select(.spec.id == $id) | .status.state')" = Cleaned ] || return 1
    done
  }
  wait_for "$clean_bound" "$what: the $busy_n attempts Cleaned within ${clean_bound} s" all_cleaned
  for id in $busy_ids; do
    at=$(attempts | jq -r --arg id "$id" '.items[] | select(.spec.id == $id) | .status.timestamps.cleanedAt // empty')
    [ -n "$at" ] || fail "$what: attempt $id is Cleaned without status.timestamps.cleanedAt"
    at=$(ms_of "$at")
    [ "$at" -le "$last" ] || last=$at
  done
  echo "$(( (last - from + 999) / 1000 ))"
}

K create ns $jobs_ns --dry-run=client -o yaml | K apply -f - >/dev/null
record_attempts $jobs_ns "$work/attempts.rec"
apply_policy $jobs_ns web $busy_n $busy_n "$work/app.pem"
three_idle() { [ "$(count_in Idle)" -ge $busy_n ]; }
wait_for 180 "$busy_n idle runners on the node" three_idle
say "$busy_n idle runners, units of the node's systemd"

# --- 1. every operator replica down
job_ms=$(( outage * 1000 / 3 ))
take_jobs "$job_ms" outage
outage_jobs=("${queued[@]}")
say "$busy_n runners busy with jobs of $(( job_ms / 1000 )) s: $(echo "$invocations" | cut -d= -f1 | tr '\n' ' ')"
agent_before=$(agent_pod_json)
api_before=$(K get --raw /metrics)
agent_m_before=$(agent_metrics) || fail "the agent's /metrics did not answer"
K -n $ns scale deploy/$rel-runner-manager-operator --replicas=0 >/dev/null
no_operator() { [ -z "$(K -n $ns get pods -l app.kubernetes.io/component=operator -o name)" ]; }
wait_for 120 "every operator pod gone after scaling to zero" no_operator
down_ms=$(now_ms)
say "operator scaled to zero: no replica serves the webhook or the broker; down for ${outage} s"
# The outage, watched every 2 s: the units not restarted, the node Ready; the jobs end in it.
ended_at=
while [ $(( $(now_ms) - down_ms )) -lt $(( outage * 1000 )) ]; do
  units_kept "outage"
  node_ready || fail "outage: node $RM_CLUSTER_NODE not Ready during the operator outage"
  if [ -z "$ended_at" ]; then
    done_all=1
    for j in "${outage_jobs[@]}"; do job_done "$j" || { done_all=; break; }; done
    [ -z "$done_all" ] || { ended_at=$(( ($(now_ms) - down_ms) / 1000 )); say "outage: the $busy_n jobs completed ${ended_at} s into the outage"; }
  fi
  sleep 2
done
[ -n "$ended_at" ] || fail "outage: the jobs of $(( job_ms / 1000 )) s did not complete in the ${outage} s outage"
for j in "${outage_jobs[@]}"; do
  [ "$(admin GET "jobs/$j" | jq -r .conclusion)" = success ] || fail "outage: job $j: $(admin GET "jobs/$j")"
done
held=$(count_in Busy)
api_after=$(K get --raw /metrics)
agent_m_after=$(agent_metrics) || fail "the agent's /metrics did not answer after the outage"
up_ms=$(now_ms)
K -n $ns scale deploy/$rel-runner-manager-operator --replicas=1 >/dev/null
K -n $ns rollout status deploy/$rel-runner-manager-operator --timeout=180s >/dev/null || fail "the operator did not come back after the outage"
ready_s=$(( ($(now_ms) - up_ms) / 1000 ))
rejected=$(( $(webhook_rejections "$api_after") - $(webhook_rejections "$api_before") ))
calls=$(( $(webhook_calls "$api_after") - $(webhook_calls "$api_before") ))
lease_failed=$(( $(prom_sum "$agent_m_after" '^runner_manager_agent_lease_renewals_total\{outcome="failed"') - $(prom_sum "$agent_m_before" '^runner_manager_agent_lease_renewals_total\{outcome="failed"') ))
reconcile_failed=$(( $(prom_sum "$agent_m_after" '^runner_manager_agent_reconcile_errors_total') - $(prom_sum "$agent_m_before" '^runner_manager_agent_reconcile_errors_total') ))
writes=$(( $(prom_sum "$agent_m_after" '^runner_manager_agent_api_requests_total\{verb="(create|patch|update)"') - $(prom_sum "$agent_m_before" '^runner_manager_agent_api_requests_total\{verb="(create|patch|update)"') ))
# What the agent's cadence allows: a renewal per heartbeat (and one per advert change: a runner
# ending), a journal write per held attempt at most every supervision backoff (1 s doubling to
# 10 s: controller::MAX_ERROR_BACKOFF), twice over. A hot loop is orders of magnitude above.
allowed=$(( 2 * (outage / heartbeat + 2 * busy_n + busy_n * (outage / 10 + 4)) ))
rate=$(awk -v n="$rejected" -v s="$outage" 'BEGIN {printf "%.3f", n / s}')
say "outage: $rejected agent writes refused by the webhook in ${outage} s (${rate}/s; $calls webhook calls), the agent's own count: $lease_failed failed Lease renewals, $reconcile_failed failed reconciles, $writes write requests; $held attempts held Busy past their jobs' end; allowed at most $allowed"
[ "$rejected" -ge $(( outage / heartbeat / 2 )) ] \
  || fail "outage: only $rejected webhook rejections in ${outage} s: the operator was not down (the agent renews every ${heartbeat} s)"
[ "$rejected" -le "$allowed" ] || fail "outage: $rejected refused writes in ${outage} s (${rate}/s), more than the $allowed the agent's retry cadence allows: a hot loop"
[ "$lease_failed" -le $(( 2 * (outage / heartbeat + 2 * busy_n) )) ] \
  || fail "outage: $lease_failed failed Lease renewals in ${outage} s at a heartbeat of ${heartbeat} s"
outage_took=$(cleaned_within "$up_ms" "after the outage")
[ "$outage_took" -le "$clean_bound" ] \
  || fail "outage: the attempts held by the outage were Cleaned ${outage_took} s after the operator was scaled up, past the bound of ${clean_bound} s"
say "operator back (Ready after ${ready_s} s): the $busy_n attempts held by the outage Cleaned ${outage_took} s after it was scaled up (bound ${clean_bound} s)"
renewed_after() { [ "$(ms_of "$(lease_renewed_at)")" -gt "$up_ms" ]; }
wait_for $(( 3 * heartbeat )) "the agent's Lease renewed after the operator's return" renewed_after
no_node_lost "after the outage"
agent_now=$(agent_pod_json)
[ "$(jq -r .metadata.uid <<<"$agent_now")" = "$(jq -r .metadata.uid <<<"$agent_before")" ] \
  && [ "$(jq '.status.containerStatuses[0].restartCount' <<<"$agent_now")" = "$(jq '.status.containerStatuses[0].restartCount' <<<"$agent_before")" ] \
  || fail "the agent restarted during the operator outage: restartCount $(jq '.status.containerStatuses[0].restartCount' <<<"$agent_before") -> $(jq '.status.containerStatuses[0].restartCount' <<<"$agent_now")"
units_kept "after the outage"
say "no node counted lost (Lease renewed at $(lease_renewed_at), no Orphaned attempt or NodeLost Event, Node Ready throughout), the agent not restarted"
wait_for 180 "$busy_n idle runners again after the outage" three_idle
no_leaks "operator outage"

# --- 2. the API server restarted with runners busy
api_pid() { cat "$CP_RUN/apiserver.pid"; }
alive() { [ -r "/proc/$1/stat" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null; }
# start_apiserver: the command line and directory the stopped one had (saved below), its log
# appended to; the pid file updated (e2e/cluster/stop.sh stops it by that); waits for /readyz.
start_apiserver() {
  (cd "$api_cwd" && exec "${api_cmd[@]}" >> "$CP_RUN/apiserver.log" 2>&1 < /dev/null) &
  echo $! > "$CP_RUN/apiserver.pid"
  api_stopped=
  api_ready() { K get --raw /readyz >/dev/null; }
  wait_for 120 "the restarted kube-apiserver ready" api_ready
}
wait_for 60 "$busy_n idle runners before the API server restart" three_idle
api_job_ms=$(( (api_down + 60) * 1000 ))
take_jobs "$api_job_ms" restart
restart_jobs=("${queued[@]}")
agent_before=$(agent_pod_json)
op_restarts=$(K -n $ns get pods -l app.kubernetes.io/component=operator -o json | jq '[.items[].status.containerStatuses[0].restartCount] | add // 0')
say "$busy_n runners busy with jobs of $(( api_job_ms / 1000 )) s; agent pod $(jq -r .metadata.name <<<"$agent_before") (restartCount $(jq '.status.containerStatuses[0].restartCount' <<<"$agent_before"))"
pid=$(api_pid)
alive "$pid" && [ "$(basename "$(readlink "/proc/$pid/exe")")" = kube-apiserver ] || fail "no kube-apiserver at pid $pid ($CP_RUN/apiserver.pid)"
mapfile -d '' api_cmd < "/proc/$pid/cmdline"
api_cwd=$(readlink "/proc/$pid/cwd")
# As e2e/control-plane/stop.sh stops it: SIGTERM, SIGKILL after 10 s (its graceful drain of
# open watches can take a minute, during which it still answers some of them).
kill "$pid"
api_stopped=1
gone_pid() { ! alive "$pid"; }
for _ in $(seq 1 100); do gone_pid && break; sleep 0.1; done
gone_pid || kill -9 "$pid" 2>/dev/null || true
wait_for 10 "kube-apiserver (pid $pid) exited" gone_pid
stopped_ms=$(now_ms)
for j in "${restart_jobs[@]}"; do
  [ "$(admin GET "jobs/$j" | jq -r .status)" = in_progress ] || fail "API server restart: job $j no longer running when the API server went down: the runners were not busy across the restart"
done
say "kube-apiserver (pid $pid) stopped with the $busy_n jobs running; down for ${api_down} s"
while [ $(( $(now_ms) - stopped_ms )) -lt $(( api_down * 1000 )) ]; do units_kept "API server down"; sleep 2; done
start_apiserver
back_ms=$(now_ms)
say "kube-apiserver started again (pid $(api_pid)) after $(( (back_ms - stopped_ms) / 1000 )) s"
renewed_after() { [ "$(ms_of "$(lease_renewed_at)")" -gt "$back_ms" ]; }
# The renewal passes the webhook: it waits for an operator replica too. The operator exits once
# when it cannot renew its leader Lease; its next start waits for the API server instead of
# exiting again, so no crash-loop back-off (10 s doubling) stands between the API server's
# return and the webhook's (before: 4 restarts, the Lease renewed 54–84 s after the return).
# With one restart the renewal came 20 s and 98 s after the return in two runs: the spread is
# not explained yet, so the bound stays where it was and the restart count is what is checked.
wait_for 240 "the agent's Lease renewed after the API server's restart" renewed_after
lease_s=$(( ($(ms_of "$(lease_renewed_at)") - back_ms) / 1000 ))
op_restarts_now=$(K -n $ns get pods -l app.kubernetes.io/component=operator -o json | jq '[.items[].status.containerStatuses[0].restartCount] | add // 0')
[ $(( op_restarts_now - op_restarts )) -le 1 ] \
  || fail "API server restart: the operator restarted $(( op_restarts_now - op_restarts )) times (at most once: start-up waits for the API server)"
for j in "${restart_jobs[@]}"; do wait_for $(( api_job_ms / 1000 + 60 )) "job $j completed after the API server restart" job_done "$j"; done
for j in "${restart_jobs[@]}"; do
  [ "$(admin GET "jobs/$j" | jq -r .conclusion)" = success ] || fail "API server restart: job $j: $(admin GET "jobs/$j")"
done
jobs_end_ms=$(now_ms)
took=$(cleaned_within "$back_ms" "after the API server restart")
after_jobs=$(( took - (jobs_end_ms - back_ms) / 1000 ))
[ "$after_jobs" -ge 0 ] || after_jobs=0
units_kept "after the API server restart"
agent_now=$(agent_pod_json)
[ "$(jq -r .metadata.uid <<<"$agent_now")" = "$(jq -r .metadata.uid <<<"$agent_before")" ] \
  || fail "the agent pod was replaced across the API server restart: $(jq -r .metadata.name <<<"$agent_before") -> $(jq -r .metadata.name <<<"$agent_now")"
[ "$(jq '.status.containerStatuses[0].restartCount' <<<"$agent_now")" = "$(jq '.status.containerStatuses[0].restartCount' <<<"$agent_before")" ] \
  || fail "the agent restarted across the API server restart: restartCount $(jq '.status.containerStatuses[0].restartCount' <<<"$agent_before") -> $(jq '.status.containerStatuses[0].restartCount' <<<"$agent_now")"
agent_ready() { [ "$(agent_pod_json | jq -r '.status.conditions[] | select(.type == "Ready") | .status')" = True ]; }
wait_for 120 "the agent Ready after the API server restart" agent_ready
no_node_lost "after the API server restart"
say "API server restart: the agent re-converged without a restart (pod $(jq -r .metadata.name <<<"$agent_now"), restartCount $(jq '.status.containerStatuses[0].restartCount' <<<"$agent_now")), its Lease renewed ${lease_s} s after the API server was back, units kept, jobs completed ($(( (jobs_end_ms - back_ms) / 1000 )) s after it was back), attempts Cleaned ${took} s after it was back (${after_jobs} s after the jobs were seen ended); operator restarts across it: $(( $(K -n $ns get pods -l app.kubernetes.io/component=operator -o json | jq '[.items[].status.containerStatuses[0].restartCount] | add // 0') - op_restarts ))"
wait_for 180 "$busy_n idle runners again after the API server restart" three_idle
no_leaks "API server restart"

# --- the policy deleted, then helm uninstall
K -n $jobs_ns delete scalepolicy web --timeout=120s >/dev/null || fail "the ScalePolicy was not deleted (its runners not drained)"
no_live() { [ -z "$(live_ids)" ]; }
wait_for 90 "no live attempt after the policy's deletion" no_live
jits=$(jits_accounted "policy deleted" $jobs_ns "$work/attempts.rec" 120)
stop_recording
say "ScalePolicy deleted: $jits"
drop_jobs_ns
H uninstall $rel -n $ns >/dev/null
no_pods() { [ -z "$(K -n $ns get pods -o name 2>/dev/null)" ]; }
wait_for 90 "no pod after helm uninstall" no_pods
[ -z "$(units)" ] || fail "units left on the node after helm uninstall: $(units | tr '\n' ' ')"
[ -z "$(ls -A "$HOST_ROOT/runners" 2>/dev/null)" ] || fail "runtime directories left: $(ls -A "$HOST_ROOT/runners")"
[ "$(admin GET runners | jq length)" = 0 ] || fail "registrations left on the simulated GitHub: $(admin GET runners)"
say "helm uninstall: no pod, unit, runtime directory or registration left"
echo "cluster/outage-check.sh: all checks passed (operator outage ${outage} s: $rejected refused writes, ${rate}/s; held attempts Cleaned ${outage_took} s after the operator's return; API server down ${api_down} s: Lease renewed ${lease_s} s after, attempts Cleaned ${took} s after it was back)"
