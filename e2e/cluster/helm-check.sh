#!/usr/bin/env bash
# `helm install` for real, and jobs on the real node: the chart into the cluster of
# e2e/cluster/start.sh with the project's images (e2e/images/build.sh, imported into the node's
# containerd) referenced by digest, against the simulated GitHub (target/debug/fake-github, bound
# to the host end of the node's veth, $HOST_IP, where pods reach it; plain http to that one host
# through the chart's test-host values, nothing else loosened).
#   1. the operator Deployment and the agent DaemonSet become Ready on the real kubelet, the agent
#      with the systemd launcher against the node's systemd; its Lease passes the admission webhook
#      (the API server calls it at a ClusterIP), it reaches the broker by its Service's DNS name;
#      the Lease rule's ValidatingAdmissionPolicy (admissionPolicy.enabled) refuses another node's
#      Lease to a token bound to the agent's pod, and the agent-pods policy a privileged, unowned
#      pod (the placeholder PriorityClass exists); with the node's /var/lib made 0700 the agent
#      refuses to start (its roots preflight in the node's view), at 0755 it is Ready again;
#   2. a GitHub App Secret and a ScalePolicy; jobs queued on the simulated GitHub, delivered as
#      signed webhooks to the webhook Service: each runner starts as a transient unit of the node's
#      systemd (rm-*.service), from the package the agent pod materialized on the node's host root,
#      and every job completes; then (2b) with minIdle 0, five jobs one after another each launch
#      their own runner, and queued -> started is printed with its timeline (issue 32); (2b') a
#      JIT refused by GitHub: the unit started ahead of it is stopped, the job runs; (2c) a
#      Persistent policy's fork gate: a pull request of the repository runs on the slot, a fork's
#      fails before its first step (JobRefused) and its write never reaches the slot; (2d) a policy's
#      npm cache: a push job's writes are kept, a fork's pull request reads them and its overwrite
#      is discarded, the next push job reads the trusted file; (2e) Docker for jobs: a job builds,
#      runs, reaches a service container by alias and by published port through its own socket,
#      is refused --privileged and -v /:/host, goes on after the agent is SIGKILLed, and no
#      engine unit, directory or process is left;
#   3. `kubectl delete pod` of the agent while a job runs: the runner's unit is not restarted (same
#      InvocationID), the new agent re-adopts it, the job completes on it, no JIT is minted twice;
#   4. `kubectl cordon`: the idle runner is drained (deregistered, its unit stopped) and nothing is
#      placed on the node; `kubectl drain` evicts the operator; uncordoned, it all comes back;
#   5. `helm upgrade` to images of another digest rolls both pods; the idle runner is re-adopted;
#   6. the ScalePolicy deleted, then `helm uninstall`: no pod, unit, runtime directory, registration
#      or JIT handoff file is left (the node's host root, the node's /run and /tmp searched).
# Throughout, a real Prometheus (e2e/cluster/prometheus.sh) scrapes what the chart's ServiceMonitor
# selects; after step 3 both endpoints pass `promtool check metrics` and every dashboard panel,
# dashboard variable and alert example of docs/observability.md returns series for the policy.
# And a real OpenTelemetry Collector (e2e/cluster/otelcol.sh, built from its Go modules) receives
# both binaries' traces: after step 2 each job's launch is one trace joining the operator's and the
# agent's spans (e2e/cluster/traces.py); with the collector stopped a job completes as before and
# both binaries count the spans they lost; started again, launches are traced again (step 3);
# before the uninstall no span the collector received holds a secret.
# After every step, nothing leaks: each rm-* unit and runtime directory belongs to a live attempt,
# each registration on the simulated GitHub to a live attempt, no jit-* handoff file stays, every
# JIT minted is the journalled runner of the attempt its name derives from or was deregistered
# unused, none used twice (product.sh's jits_accounted: the simulated GitHub's /_admin/mints
# joined with a record of the attempts' journal), and no mount is under the host root on
# the node when the install sets materialize copy, or, with overlay or auto (the chart's default),
# only live runtimes' overlays; none after uninstall. With overlay or auto the agent must have
# chosen overlay (its log line and its runner_manager_agent_materializer{mode} gauge), and each
# live runner must run from its runtime's overlay: an `overlay runner-package` mount at the
# runtime in the node's mount table (PID 1's: the agent's mount reached the host through the
# Bidirectional volume) and in the runner unit's own mount namespace. Each of these waits, bounded,
# for what it finds to settle (a runtime listed a moment before its attempt's Cleaned, a minIdle
# replacement's JIT minted a moment before its journal write): a leak is what stays.
# Prints `kubectl get pods -A -o wide` and `kubectl get sp,ra`. Needs KUBECONFIG of that cluster
# (default $RM_CLUSTER_RUN/kubeconfig), the images built and `cargo build --workspace --bins`.
# RM_CHART: a packaged chart to install instead of charts/runner-manager (`make test` installs
# the archive e2e/release.sh packages).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/env.sh"
. "$here/product.sh"
. "$here/prometheus.sh"
. "$here/otelcol.sh"
export KUBECONFIG=${KUBECONFIG:-$RM_CLUSTER_RUN/kubeconfig}
K() { "$RM_TOOLS_BIN/kubectl" "$@"; }
H() { "$RM_TOOLS_BIN/helm" "$@"; }
N() { "$NODE_STATE/bin/nsexec" "$@"; }
ns=runner-manager-system rel=rm jobs_ns=rm-jobs
HOST_ROOT=$NODE_FS/var/lib/runner-manager
work=$RM_CLUSTER_RUN/helm-check
t0=$(date +%s%N)
say() { local ms=$(( ($(date +%s%N) - t0) / 1000000 )); printf 'cluster/helm-check.sh [%d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*"; }
fail() {
  echo "cluster/helm-check.sh: FAIL: $*" >&2
  K get pods -A -o wide >&2 || true
  K get sp,ra -n $jobs_ns -o wide >&2 || true
  K -n $ns logs deploy/$rel-runner-manager-operator --tail=25 >&2 2>&1 || true
  K -n $ns logs ds/$rel-runner-manager-node-agent --tail=25 >&2 2>&1 || true
  N systemctl list-units --all --no-legend 'rm-*' >&2 || true
  echo "simulated GitHub's log: $work/fake-github.log" >&2
  exit 1
}

imported=$'\n'$(N ctr -n k8s.io images ls -q)$'\n'
for i in operator node-agent; do
  [ -s "$RM_IMAGES/$i.ref" ] || { echo "cluster/helm-check.sh: no $i image: run e2e/images/build.sh before e2e/cluster/start.sh" >&2; exit 1; }
  case "$imported" in *$'\n'"$(sed -n 2p "$RM_IMAGES/$i.ref")"$'\n'*) ;;
    *) echo "cluster/helm-check.sh: $i image not in the node's containerd: e2e/cluster/load-images.sh" >&2; exit 1 ;;
  esac
done

# --- the simulated GitHub where pods reach it
rm -rf "$work"; mkdir -p "$work"
fake_pid= record_pid= proxy_pid=
# The jobs namespace goes before the operator: its policies and attempts carry the operator's
# finalizers (a namespace deleted after `helm uninstall` stays Terminating). Left by a run that
# died without its operator, their finalizers are dropped by hand.
cleanup() {
  stop_recording
  K uncordon "$RM_CLUSTER_NODE" >/dev/null 2>&1 || true
  drop_jobs_ns 60
  H uninstall $rel -n $ns >/dev/null 2>&1 || true
  [ -z "$fake_pid" ] || kill "$fake_pid" 2>/dev/null || true
  [ -z "$proxy_pid" ] || kill "$proxy_pid" 2>/dev/null || true
  prom_stop
  otel_stop
}
trap cleanup EXIT
start_fake_github "$work" || fail "the simulated GitHub did not start"
github_app "$work"
N curl -fsS "$gh/_admin/runners" >/dev/null || fail "the node does not reach the simulated GitHub at $gh"
say "simulated GitHub at $gh (reached from the node)"
# A real HTTP proxy between the product and the simulated GitHub (Debian's tinyproxy, chart
# values proxy.http and proxy.https): every GitHub call and package download must go through it,
# and no call to the broker or the API server (NO_PROXY, and the Kubernetes client reads no proxy).
proxy_port=${RM_PROXY_PORT:-18888}
command -v tinyproxy >/dev/null || fail "no tinyproxy: e2e/cluster/install-packages.sh installs Debian's tinyproxy-bin"
cat > "$work/tinyproxy.conf" <<CONF
Port $proxy_port
Listen $HOST_IP
Timeout 600
LogFile "$work/tinyproxy.log"
LogLevel Info
MaxClients 200
Allow $RM_CLUSTER_POD_CIDR
Allow $NODE_IP
DisableViaHeader Yes
CONF
tinyproxy -d -c "$work/tinyproxy.conf" >"$work/tinyproxy.out" 2>&1 &
proxy_pid=$!
proxy=http://$HOST_IP:$proxy_port
wait_for 10 "tinyproxy at $proxy reaching the simulated GitHub" N curl -fsS -o /dev/null -x "$proxy" "$gh/_admin/runners"
say "tinyproxy at $proxy (the chart's proxy.http and proxy.https)"
# A real OpenTelemetry Collector (e2e/cluster/otelcol.sh) for both binaries' traces (the chart's
# telemetry.otlpEndpoint), reached without the proxy (proxy.noProxy, as a collector in the
# cluster is through .svc).
otel_start
say "OpenTelemetry Collector $("$otel_bin" --version 2>/dev/null | awk '{print $NF}') at $otel_endpoint (the node's network namespace): the chart's telemetry.otlpEndpoint"

# --- 1. helm install
op=$(sed -n 2p "$RM_IMAGES/operator.ref") ag=$(sed -n 2p "$RM_IMAGES/node-agent.ref")
drop_jobs_ns 60
H uninstall $rel -n $ns >/dev/null 2>&1 || true
# No runner package cached on the node (a cluster that ran this before keeps one): the first
# launch downloads it, through the proxy below. Nothing of ours runs on the node now.
rm -rf "$HOST_ROOT/packages"
# Quicker heartbeats and passes than the defaults, for a scenario of a few minutes; the agents'
# headless metrics Service (what the chart's ServiceMonitor selects besides the operator's, for
# the Prometheus below); the proxy above.
tuning=(--set nodeAgent.capacity=3 --set nodeAgent.heartbeatSeconds=2 --set operator.resyncInterval=2s
  --set operator.observeInterval=5s --set admissionPolicy.enabled=true --set nodeAgent.metricsService=true
  --set "proxy.http=$proxy" --set "proxy.https=$proxy" --set "telemetry.otlpEndpoint=$otel_endpoint"
  --set-json "proxy.noProxy=[\"$NODE_IP\"]"
  --set "placeholders.image=$(sed -n 1p "$RM_IMAGES/pause.ref")")
install_product $rel $ns "${tuning[@]}" || fail "the operator or the node agent is not Ready"
chart_values
# How the install materializes runtimes (the chart's nodeAgent.materialize): what may be mounted.
materialize=$(K -n $ns get ds/$rel-runner-manager-node-agent \
  -o jsonpath='{.spec.template.spec.containers[*].env[?(@.name=="RM_MATERIALIZE")].value}')
case "$materialize" in copy|overlay|auto) ;; *) fail "the agent's RM_MATERIALIZE is '$materialize'" ;; esac
say "helm install of ${RM_CHART:-charts/runner-manager}: operator ${op#*@}, node agent ${ag#*@}: both Ready on node $RM_CLUSTER_NODE (materialize $materialize)"
K get pods -A -o wide
prom_start
say "Prometheus $(prometheus --version 2>&1 | head -1 | cut -d' ' -f3) at $prom_url scrapes what the chart's ServiceMonitor selects"
log=$(K -n $ns logs ds/$rel-runner-manager-node-agent)
case "$log" in *"launcher Systemd"*|*'"launcher":"Systemd"'*) ;; *) fail "the agent does not serve with the systemd launcher" ;; esac
lease=$(K -n $ns get lease -o name 2>/dev/null | grep -c "$RM_CLUSTER_NODE" || true)
[ "$lease" -ge 1 ] || fail "no Lease of node $RM_CLUSTER_NODE (webhook or broker unreachable)"
say "the agent serves with the systemd launcher; its node Lease passed the admission webhook"
# What the agent chose: with overlay or auto on this node's ext4/xfs host root the start-up probe
# mount must succeed, so the runtimes are overlays (a silent fallback to the copy would pass every
# other check here).
if [ "$materialize" != copy ]; then
  case "$log" in *"packages are laid into runtimes by overlay"*) ;;
    *) fail "materialize $materialize: the agent did not log that it lays packages by overlay: $(grep -o 'packages are laid into runtimes by [a-z]*' <<<"$log" || true)" ;; esac
  pod_ip=$(K -n $ns get pods -l app.kubernetes.io/component=node-agent -o jsonpath='{.items[0].status.podIP}')
  gauge=$(N curl -fsS "http://$pod_ip:9090/metrics" | grep '^runner_manager_agent_materializer{mode="overlay"} ' || true)
  [ "${gauge##* }" = 1 ] || fail "materialize $materialize: runner_manager_agent_materializer{mode=\"overlay\"} is '$gauge', not 1"
  say "materialize $materialize: the agent lays packages by overlay (log line; runner_manager_agent_materializer{mode=\"overlay\"} 1)"
fi

# The Lease rule in CEL (admissionPolicy.enabled, Kubernetes 1.30+): the API server itself
# refuses another node's Lease to a token bound to the agent's pod.
T() { "$RM_TOOLS_BIN/kubectl" --kubeconfig /dev/null --server "https://$HOST_IP:$RM_CLUSTER_API_PORT" \
  --certificate-authority "$CP_RUN/pki/ca.crt" --token "$1" "${@:2}"; }
token=$(K -n $ns create token $rel-runner-manager-node-agent --bound-object-kind Pod \
  --bound-object-name "$(K -n $ns get pods -l app.kubernetes.io/component=node-agent -o jsonpath='{.items[0].metadata.name}')")
forged=$(printf 'apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: runner-manager-agent-not-mine, namespace: %s}\n' $ns \
  | T "$token" create --dry-run=server -f - 2>&1 || true)
case "$forged" in *"ValidatingAdmissionPolicy '"*"denied request: Lease runner-manager-agent-not-mine: an agent writes only its own node's Lease (runner-manager-agent-$RM_CLUSTER_NODE)"*) ;;
  *) fail "another node's Lease, written with the agent's pod-bound token, was not refused by the ValidatingAdmissionPolicy: $forged" ;; esac
say "the ValidatingAdmissionPolicy refused another node's Lease to the agent's pod-bound token"
# The agents' pod rights (issue 28 item 1): none to write. With the same token, a privileged
# hostPID pod on the agent's own node, and the placeholder the broker would build, are refused by
# RBAC (e2e/tests/e2e/attacks_pods.rs attacks every field on the development control plane); the
# agent's own placeholders and runner pods are made by the operator on its order. The
# placeholders' PriorityClass exists.
K get priorityclass "$rel-runner-manager-$ns-placeholder" >/dev/null 2>&1 \
  || K get priorityclass -o name | grep -q -- "-placeholder" || fail "no placeholder PriorityClass"
podattack=$(printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: not-a-runner, namespace: %s}\nspec:\n  nodeName: %s\n  hostPID: true\n  containers: [{name: c, image: x, securityContext: {privileged: true}}]\n' $ns "$RM_CLUSTER_NODE" \
  | T "$token" create --dry-run=server -f - 2>&1 || true)
case "$podattack" in *'cannot create resource "pods"'*) ;;
  *) fail "a privileged hostPID pod, created with the agent's pod-bound token, was not refused by RBAC: $podattack" ;; esac
for verb in "create pods" "delete pods" "patch pods"; do
  if T "$token" auth can-i $verb -n $ns >/dev/null 2>&1; then fail "the agent's pod-bound token may $verb"; fi
done
say "the agent's pod-bound token may create, delete and patch no pod (RBAC refused a privileged pod on its own node)"

# The roots preflight checks the node's view (PID 1's root), not only the container's: a node
# /var/lib the runner accounts cannot search is refused at start, before any JIT is spent.
agent_pod() { K -n $ns get pods -l app.kubernetes.io/component=node-agent -o jsonpath='{.items[0].metadata.name}'; }
agent_refuses() {
  local log # not a pipeline: under pipefail a missing --previous log would fail it
  log=$(K -n $ns logs "$(agent_pod)" 2>/dev/null; K -n $ns logs "$(agent_pod)" --previous 2>/dev/null || true)
  grep -q '/var/lib is not searchable by the runner accounts (mode 700)' <<<"$log"
}
chmod 0700 "$NODE_FS/var/lib"
K -n $ns delete pod "$(agent_pod)" --wait=true >/dev/null
if ! (wait_for 60 "the agent refusing a node /var/lib of mode 0700" agent_refuses); then
  chmod 0755 "$NODE_FS/var/lib"; fail "the agent started on a node whose /var/lib runners cannot search"
fi
chmod 0755 "$NODE_FS/var/lib"
K -n $ns delete pod "$(agent_pod)" --wait=true >/dev/null
K -n $ns rollout status ds/$rel-runner-manager-node-agent --timeout=120s >/dev/null || fail "the agent is not Ready once /var/lib is 0755 again"
say "the agent refused a node /var/lib of mode 0700 (its roots preflight in the node's view); Ready again at 0755"

# --- 2. a policy, jobs
# The attempts' journal for the JIT ledger (product.sh): attempts go with their policy.
K create ns $jobs_ns --dry-run=client -o yaml | K apply -f - >/dev/null
record_attempts $jobs_ns "$work/attempts.rec"
# A tenant value in runner.env: it must reach the runner and nothing any other account can read.
tenant_marker=tenantvalue$(openssl rand -hex 8)
apply_policy $jobs_ns web 1 3 "$work/app.pem" "TENANT_MARKER=$tenant_marker"

# Attempts in JSON, once per check.
attempts() { K -n $jobs_ns get ra -o json; }
live_ids() { attempts | jq -r '.items[] | select(.status.state != "Cleaned") | .spec.id'; }
no_live() { [ -z "$(live_ids)" ]; }
# cgroup/unit names are rm-<the attempt's uuid without dashes, first 12>: what unit_name makes.
unit_of() { echo "rm-$(echo "$1" | tr -d - | cut -c1-12).service"; }
units() { N systemctl list-units --all --plain --no-legend 'rm-*.service' | awk '{print $1}' | sort; }
idle_count() { attempts | jq '[.items[] | select(.status.state == "Idle")] | length'; }
job_done() { [ "$(admin GET "jobs/$1" | jq -r .status)" = completed ]; }
job_running() { [ "$(admin GET "jobs/$1" | jq -r .status)" = in_progress ]; }
has_idle() { [ "$(idle_count)" -ge 1 ]; }
# `|| true`: a runtime removed while find walks it makes find fail (as in pods-check.sh); under
# pipefail that ended the check silently after the agent restart (seen once, issue 28's run).
handoffs() { { find "$HOST_ROOT" -name 'jit-*' 2>/dev/null || true; N find /run /tmp -xdev -name 'jit-*' 2>/dev/null || true; } | sort -u; }
# What belongs to no live attempt, one item a line (settle waits for none): the rm-* units,
# runtime directories and mounts under the host root on the node. What is on the node is listed
# first, the live attempts after: an attempt created in between (a minIdle replacement) is among
# them; one cleaned in between shows until its runtime goes.
# A live attempt's unit and, with spec.docker, its engine's (rm-<12hex>-docker.service).
live_units() { for id in $(live_ids); do unit_of "$id"; unit_of "$id" | sed 's/\.service$/-docker.service/'; done | sort; }
stray_units() {
  local now want u
  now=$(units); want=$(live_units)
  for u in $now; do grep -qxF -- "$u" <<<"$want" || echo "unit $u"; done
}
stray_dirs() {
  local dirs want d
  dirs=$(ls "$HOST_ROOT/runners" 2>/dev/null || true); want=$(live_units)
  for d in $dirs; do grep -qxF -- "rm-$d.service" <<<"$want" || echo "runtime directory runners/$d"; done
}
# The agent pod's hostPath mounts stay in its container (a Bidirectional pair of nested roots
# once doubled the agent's own mounts at every agent start): with the copy nothing at all is
# mounted under the host root on the node; with overlay (or auto) only the overlay a runtime
# is materialized as (lower the cached package, upper the runtime, at runners/<id>), one per
# live attempt's runtime.
host_mounts() { N awk '$5 ~ "^/var/lib/runner-manager" { for (i = 7; i <= NF; i++) if ($i == "-") { print $5, $(i + 1), $(i + 2); break } }' /proc/1/mountinfo; }
stray_mounts() {
  local mounted want point fstype source d
  mounted=$(host_mounts); want=$(live_units)
  while read -r point fstype source; do
    [ -n "$point" ] || continue
    if [ "$materialize" = copy ]; then echo "mount $point ($fstype), where materialize copy mounts nothing"; continue; fi
    d=${point#/var/lib/runner-manager/runners/}
    grep -qxF -- "rm-$d.service" <<<"$want" || echo "mount $point ($fstype) of no live attempt's runtime"
    [ "$fstype $source" = "overlay runner-package" ] || echo "mount $point is $fstype from $source, not a runtime's overlay"
  done <<<"$mounted"
}
# No leak: every unit, runtime directory, mount and registration belongs to a live attempt; no
# handoff file stays; every JIT minted is journalled by its attempt or was deregistered unused,
# none used twice.
no_leaks() {
  local seen jits
  settle 30 "$1: units of no live attempt" stray_units
  settle 30 "$1: runtime directories of no live attempt" stray_dirs
  settle 30 "$1: mounts under the host root on the node" stray_mounts
  # A starting runner's handoff is in flight until its unit takes it: a file is a leak when it stays.
  seen=$(handoffs)
  gone() { local f; for f in $seen; do [ ! -e "$f" ] && ! N test -e "$f" || return 1; done; }
  [ -z "$seen" ] || wait_for 15 "$1: JIT handoff files taken or removed: $(echo "$seen" | tr '\n' ' ')" gone
  jits=$(jits_accounted "$1" $jobs_ns "$work/attempts.rec")
  say "$1: no leak ($(units | grep -c . || true) unit(s), $(host_mounts | grep -c . || true) runtime overlay(s), $(admin GET runners | jq length) registration(s), $jits, no handoff file)"
}

wait_for 90 "an idle runner on the node" has_idle
first=$(attempts | jq -r '[.items[] | select(.status.state == "Idle")][0].spec.id')
N systemctl is-active --quiet "$(unit_of "$first")" || fail "the idle runner's unit $(unit_of "$first") is not active in the node's systemd"
[ -n "$(ls "$HOST_ROOT/packages" 2>/dev/null)" ] || fail "no package materialized under the node's host root"
say "idle runner $(unit_of "$first") active in the node's systemd; package on the node's host root: $(ls "$HOST_ROOT/packages" | head -1)"
# The runner runs from an overlay visible on the host: its runtime is the agent's overlay in the
# node's mount table (the agent's mount propagated out of its container) and in the unit's mount
# namespace (systemd set up the unit's sandbox from the host's table), its lower the cached package.
runs_from_overlay() {
  local id=$1 rt pid line
  rt=/var/lib/runner-manager/runners/$(unit_of "$id" | sed 's/^rm-//; s/\.service$//')
  pid=$(N systemctl show -P MainPID "$(unit_of "$id")")
  [ -n "$pid" ] && [ "$pid" != 0 ] || fail "the runner unit $(unit_of "$id") has no main process"
  for table in /proc/1/mountinfo "/proc/$pid/mountinfo"; do
    line=$(N awk -v rt="$rt" '$5 == rt { for (i = 7; i <= NF; i++) if ($i == "-") { print $(i + 1), $(i + 2), $(i + 3); break } }' "$table" | tail -1)
    case "$line" in "overlay runner-package "*lowerdir=/var/lib/runner-manager/packages/*) ;;
      *) fail "runner $(unit_of "$id"): its runtime $rt in $table is '$line', not the agent's overlay over a cached package" ;; esac
  done
  N test -x "$rt/bin/Runner.Listener" || fail "runner $(unit_of "$id"): no bin/Runner.Listener through its overlay"
}
# The native sandbox (issue 28 items 3, 4), from the node's own systemd: every property as the
# node's systemd holds it for the running unit, the network filter with the cluster's ranges and
# the node's address, and the tenant's runner.env in none of what another account can read (the
# unit's Environment=, its unit file); the agent proved the filter at start (its Lease).
in_list() { tr ' ' '\n' <<<"$1" | grep -qxE -- "$2"; }
sandboxed() {
  local u=$1 v p
  for p in SystemCallArchitectures=native RestrictNamespaces=yes PrivateIPC=yes NoNewPrivileges=yes \
    ProtectSystem=strict ProtectProc=invisible PrivateTmp=yes PrivateDevices=yes; do
    v=$(N systemctl show -P "${p%%=*}" "$u")
    [ "$v" = "${p#*=}" ] || fail "runner $u: ${p%%=*}=$v in the node's systemd, not ${p#*=}"
  done
  v=$(N systemctl show -P SystemCallFilter "$u")
  in_list "$v" read && ! in_list "$v" mount || fail "runner $u: SystemCallFilter is not @system-service: ${v:0:200}"
  in_list "$v" kexec_load && fail "runner $u: SystemCallFilter allows kexec_load"
  v=$(N systemctl show -P RestrictAddressFamilies "$u")
  [ "$(tr ' ' '\n' <<<"$v" | sort | xargs)" = "AF_INET AF_INET6 AF_NETLINK AF_UNIX" ] || fail "runner $u: RestrictAddressFamilies=$v"
  v=$(N systemctl show -P InaccessiblePaths "$u")
  for p in /var/lib/kubelet /var/lib/containerd /run/containerd /var/log/pods /etc/kubernetes; do
    in_list "$v" "-?$p" || fail "runner $u: InaccessiblePaths=$v lacks $p"
  done
  v=$(N systemctl show -P IPAddressDeny "$u")
  for p in 169.254.0.0/16 fe80::/10 168.63.129.16 fd20:ce::254 fd00:ec2::23 fd00:ec2::254 100.100.100.200 \
    "$RM_CLUSTER_POD_CIDR" "$RM_CLUSTER_SERVICE_CIDR" "$NODE_IP"; do
    in_list "$v" "${p//./\\.}(/32|/128)?" || fail "runner $u: IPAddressDeny=$v lacks $p"
  done
  v=$(N systemctl show -P Environment "$u")
  case "$v" in *"$tenant_marker"*|*TENANT_MARKER*|*RUNNER_MANAGER_RUNNER_ENV*) fail "runner $u: runner.env in the unit's Environment=: $v" ;; esac
  N grep -q "$tenant_marker" "/run/systemd/transient/$u" && fail "runner $u: runner.env in its unit file"
  # ... while it did reach the runner (the listener's own environment, read as root).
  p=$(N systemctl show -P MainPID "$u")
  # Read whole, then matched: a `grep -q` that exits early would SIGPIPE the writer (pipefail).
  environ=$(N cat "/proc/$p/environ" | tr '\0' '\n')
  grep -qx "TENANT_MARKER=$tenant_marker" <<<"$environ" || fail "runner $u: runner.env did not reach the listener"
  return 0
}
sandboxed "$(unit_of "$first")"
lease=$(K -n $ns get lease "runner-manager-agent-$RM_CLUSTER_NODE" -o json)
[ "$(jq -r '.metadata.annotations["runner-manager.dev/native-refused"] // ""' <<<"$lease")" = "" ] || fail "the agent refused native runners: $(jq -c .metadata.annotations <<<"$lease")"
jq -e '.metadata.annotations["runner-manager.dev/providers"] | split(",") | index("native")' <<<"$lease" >/dev/null || fail "the Lease offers no native runners: $(jq -c .metadata.annotations <<<"$lease")"
# Read whole first: `grep -q` on the pipe would end kubectl early (SIGPIPE, and pipefail).
agent_log=$(K -n $ns logs ds/$rel-runner-manager-node-agent)
grep -q 'runner network filter proven' <<<"$agent_log" || fail "the agent did not log its network proof"
say "runner $(unit_of "$first"): the node's systemd holds its sandbox (syscall filter, no namespaces, private IPC, hidden kubelet/containerd/pod logs, link-local, metadata, pod $RM_CLUSTER_POD_CIDR, Service $RM_CLUSTER_SERVICE_CIDR and node $NODE_IP denied); runner.env reached the listener and is in no unit property or file; the agent proved the filter at start ($(grep -o 'could not reach [^ ,"]*' <<<"$agent_log" | head -1))"
if [ "$materialize" != copy ]; then
  runs_from_overlay "$first"
  say "runner $(unit_of "$first") runs from an overlay (upper runners/<id>, lower packages/<sha256>) seen in the node's mount table and its unit's namespace"
fi
ids=()
for i in 1 2 3; do ids+=("$(queue_job "build-$i" 2000)"); done
for id in "${ids[@]}"; do wait_for 120 "job $id completed" job_done "$id"; done
for id in "${ids[@]}"; do
  [ "$(admin GET "jobs/$id" | jq -r .conclusion)" = success ] || fail "job $id: $(admin GET "jobs/$id")"
done
say "3 jobs completed on runners of the node's systemd"
# Through the proxy: the operator's JIT mints and the agent's package download; nothing else of
# ours (the broker, the API server) and nothing in the log that is not a request to GitHub.
proxied=$(grep -o 'Request (file descriptor [0-9]*): [A-Z]* [^ ]*' "$work/tinyproxy.log" | sed 's/.*: //' || true)
mints=$(grep -c "^POST $gh/.*generate-jitconfig" <<<"$proxied" || true)
[ "$mints" -ge 3 ] || fail "the proxy saw $mints JIT mints (3 jobs ran): $(head -20 <<<"$proxied" | tr '\n' ' ')"
grep -q "^GET $gh/_downloads/" <<<"$proxied" || fail "the agent's package download did not go through the proxy: $(head -20 <<<"$proxied" | tr '\n' ' ')"
strays=$(grep -v " $gh/" <<<"$proxied" || true)
[ -z "$strays" ] || fail "the proxy carried requests not to GitHub (NO_PROXY): $(tr '\n' ' ' <<<"$strays")"
say "through the proxy: $mints JIT mints, the package download, $(grep -c . <<<"$proxied") requests in all, each to the simulated GitHub (none to the broker or the API server)"
# Each job's launch is one trace at the collector: the operator's runner.create, broker.exchange
# and the mint's github.request, the agent's launch and its steps, joined through the attempt's
# traceparent annotation, with the attributes docs/observability.md names.
runners=$(for id in "${ids[@]}"; do admin GET "jobs/$id" | jq -r .runner_name; done | jq -R . | jq -s .)
attempts | jq --argjson r "$runners" '[.items[] | select(.status.runner.name as $n | $r | index($n))
  | {uid: .metadata.uid, namespace: .metadata.namespace, name: .metadata.name}]' > "$work/traced-attempts.json"
[ "$(jq length "$work/traced-attempts.json")" = 3 ] || fail "the 3 jobs' attempts not found by runner name: $runners"
otel_traces joined "$otel_file" "$work/traced-attempts.json"
say "OpenTelemetry Collector: each of the 3 jobs' launches is one trace joining the operator's and the agent's spans (trees above)"
# The collector stopped: a job is served as before (a span's end never waits for the network;
# the queue is bounded) and both binaries count the spans they could not export.
otel_stop
dropped_op=$(otel_dropped runner_manager_) dropped_ag=$(otel_dropped runner_manager_agent_)
wait_for 90 "an idle runner" has_idle
dark=$(queue_job dark 2000)
wait_for 120 "job $dark completed with the collector down" job_done "$dark"
[ "$(admin GET "jobs/$dark" | jq -r .conclusion)" = success ] || fail "job $dark (collector down): $(admin GET "jobs/$dark")"
counted() { [ "$(otel_dropped runner_manager_)" -gt "$dropped_op" ] && [ "$(otel_dropped runner_manager_agent_)" -gt "$dropped_ag" ]; }
wait_for 60 "the operator and the agent counting spans they could not export (trace_spans_dropped_total{reason=\"export_failed\"} from $dropped_op and $dropped_ag)" counted
say "collector stopped: job $dark completed as before; spans dropped for a failed export: operator $dropped_op -> $(otel_dropped runner_manager_), agent $dropped_ag -> $(otel_dropped runner_manager_agent_)"
otel_start
say "collector started again ($otel_file)"
N systemctl list-units --all --no-legend 'rm-*'
K get sp,ra -n $jobs_ns
no_leaks "jobs"

# --- 2b. queued -> started on the real node (issue 32 item 0): with minIdle 0 every job launches
# its own runner through the whole product (webhook, operator, placeholder pod admitted by the
# kubelet, broker, the node's systemd). A watch stamps each attempt's first sight in each state
# (kubectl's stream, stamped as it reads: a few ms late at worst); the agent's own step timings
# are the attempts' status.launch. Printed beside nothing it must meet yet: the placeholder's
# admission is a floor the process harness does not have (docs/benchmarks.md).
K -n $jobs_ns patch scalepolicy web --type merge -p '{"spec":{"minIdle":0}}' >/dev/null
wait_for 120 "the idle runners drained (minIdle 0)" no_live
( K -n $jobs_ns get ra --watch -o jsonpath='{.spec.id}|{.status.state}{"\n"}' 2>/dev/null \
    | while IFS= read -r line; do echo "$(date +%s%3N)|$line"; done >> "$work/latency.rec" ) &
stamp_pid=$!
# The watch's first list (the earlier jobs' attempts, kept as history) is in before a job is
# queued: an attempt it listed late would be stamped late.
wait_for 30 "the attempts' watch listing" test -s "$work/latency.rec"
: > "$work/latency.queued"
for i in $(seq 1 "${RM_WARM_LAUNCHES:-5}"); do
  queued=$(date +%s%3N)
  lat=$(queue_job "latency-$i" 0)
  echo "$queued $lat" >> "$work/latency.queued"
  wait_for 120 "job $lat completed" job_done "$lat"
  wait_for 120 "no live attempt after job $lat" no_live
done
pkill -P "$stamp_pid" 2>/dev/null || true; kill "$stamp_pid" 2>/dev/null || true
attempts > "$work/latency-attempts.json"
latency=$(python3 - "$work/latency.rec" "$work/latency.queued" "$work/latency-attempts.json" <<'PY'
import json, sys
seen = {}
for line in open(sys.argv[1]):
    parts = line.strip().split("|")
    if len(parts) != 3 or not parts[1]:
        continue
    t, aid, state = int(parts[0]), parts[1], parts[2] or "Pending"
    seen.setdefault(aid, {}).setdefault(state, t)
queued = [int(l.split()[0]) for l in open(sys.argv[2]) if l.strip()]
firsts = sorted((min(states.values()), aid) for aid, states in seen.items())
steps = {"created": [], "admitted": [], "JIT": [], "started": []}
sampled = set()
for q in queued:
    # The first attempt first seen after this job was queued is its runner's (minIdle 0: none
    # is launched for anything else, and the previous one concluded before this job).
    aid = next((a for t, a in firsts if t >= q), None)
    if aid is None:
        continue
    sampled.add(aid)
    s = seen[aid]
    for step, state in (("created", None), ("admitted", "Allocated"), ("JIT", "JitReceived"), ("started", "Starting")):
        t = min(s.values()) if state is None else s.get(state)
        if t is not None:
            steps[step].append(t - q)
def p50(v):
    v = sorted(v)
    return v[len(v) // 2] if v else None
started = sorted(steps["started"])
if len(started) < len(queued):
    print(f"only {len(started)} of {len(queued)} samples were seen Starting")
    sys.exit(1)
launch = {}
for a in json.load(open(sys.argv[3]))["items"]:
    l = (a.get("status") or {}).get("launch")
    if l and a["spec"]["id"] in sampled:
        for k in ("materializeMs", "prepareMs", "registerMs", "spawnMs"):
            launch.setdefault(k, []).append(l.get(k, 0))
line = "; ".join(f"{k} p50 {p50(v)} ms" for k, v in steps.items() if v)
agent = ", ".join(f"{k[:-2]} p50 {p50(v)} ms" for k, v in launch.items())
print(f"queued -> started on the real node over {len(started)} warm launches: p50 {p50(started)} ms, max {started[-1]} ms (target p50 <= 250 ms: the placeholder's admission by the kubelet is a floor the process harness does not have); timeline {line}; the agent's steps (status.launch): {agent}")
PY
) || fail "the real node's launch latency could not be measured: $latency"
say "$latency"

# --- 2b'. a JIT refused on the real node (issue 32): the runner's unit is started before its JIT
# is asked for, and nothing journalled names it; the failed launch stops it by the attempt's name
# (and so would the attempt's cleanup), and the job runs on the next attempt. A 403 is not retried
# by the broker.
admin POST faults '{"endpoint": "generate_jitconfig", "count": 1, "status": 403}' >/dev/null
refused_job=$(queue_job refused-jit 0)
wait_for 120 "job $refused_job completed after a refused JIT" job_done "$refused_job"
refused=$(attempts | jq -r '.items[] | select(.status.outcome.reason == "JitRequestFailed") | .spec.id' | tail -n 1)
[ -n "$refused" ] || fail "no attempt concluded JitRequestFailed after the injected 403: $(attempts | jq -c '[.items[] | .status.outcome]')"
refused_unit_gone() { ! units | grep -qx "$(unit_of "$refused")"; }
wait_for 60 "the unit started ahead for attempt $refused stopped" refused_unit_gone
say "a JIT refused (403): attempt $refused concluded JitRequestFailed, the unit started ahead of its JIT ($(unit_of "$refused")) was stopped, job $refused_job ran on the next attempt"
K -n $jobs_ns patch scalepolicy web --type merge -p '{"spec":{"minIdle":1}}' >/dev/null

# --- 2c. the fork gate on the real node (issue 31 item 3): a Persistent policy with a label of its
# own, so only its runner takes these jobs. Its runner's job-started hook runs under the node's
# systemd sandbox and reaches the agent's gate socket (host root, read-only to the unit); the
# broker reads the run on the simulated GitHub. A pull request from acme/web runs and writes into
# the slot; one from a fork fails before its first step, with a JobRefused event, and its write
# is not in the slot.
# labelled_policy NAME SPEC: a policy of acme/web whose runners (one at most, none idle) take only
# the jobs labelled NAME, with SPEC (one more `spec` entry) besides.
labelled_policy() {
  K -n $jobs_ns apply -f - >/dev/null <<YAML
apiVersion: runner-manager.dev/v1alpha1
kind: ScalePolicy
metadata: {name: $1}
spec:
  github: {url: "https://github.com/acme/web", credentialsSecretRef: {name: github-app}}
  labels: [self-hosted, linux, x64, $1]
  minIdle: 0
  maxRunners: 1
  runner: {version: latest}
  $2
YAML
}
labelled_policy slot "workspace: {mode: Persistent}"
# labelled_job LABEL NAME HEAD BEHAVIOUR: a job of acme/web for the policy with label LABEL;
# HEAD "-" for a push, else a pull request whose head is HEAD.
labelled_job() {
  admin POST jobs "$(jq -n --arg l "$1" --arg n "$2" --arg h "$3" --argjson b "$4" '{owner: "acme", repo: "web", labels: ["self-hosted", "linux", $l], name: $n, behaviour: $b} + (if $h == "-" then {} else {pull_request: {head_repository: $h}} end)')" | jq -r .job_id
}
# pull_request_job NAME FILE HEAD: a job of a pull request whose head is HEAD, writing FILE.
pull_request_job() {
  labelled_job slot "$1" "$3" "$(jq -n --arg f "$2" '{duration_ms: 0, write_files: [{path: $f, bytes: 16}]}')"
}
conclusion() { admin GET "jobs/$1" | jq -r .conclusion; }
own=$(pull_request_job own-pr own.txt acme/web)
wait_for 180 "the repository's own pull request (job $own) completed" job_done "$own"
[ "$(conclusion "$own")" = success ] || fail "the repository's own pull request did not pass the gate: $(admin GET "jobs/$own")"
fork=$(pull_request_job fork-pr poison.txt mallory/web)
wait_for 180 "the fork's pull request (job $fork) completed" job_done "$fork"
[ "$(conclusion "$fork")" = failure ] || fail "a fork's pull request ran on a persistent slot: $(admin GET "jobs/$fork")"
fork_run=$(admin GET "jobs/$fork" | jq -r .run_id)
refused_event() { K -n $jobs_ns get events.events.k8s.io -o json | jq -e --arg r "run $fork_run refused (ForkPullRequest)" '[.items[] | select(.reason == "JobRefused" and (.note | startswith($r)))] | length > 0' >/dev/null; }
wait_for 30 "a JobRefused event for the fork's run $fork_run" refused_event
slot_live() { attempts | jq -e '[.items[] | select(.spec.policy == "slot" and .status.state != "Cleaned")] | length == 0' >/dev/null; }
wait_for 60 "the slot policy's attempts cleaned" slot_live
slot_work=$HOST_ROOT/slots/$jobs_ns/$(K -n $jobs_ns get sp slot -o jsonpath='{.metadata.uid}')/s1/_work
[ -f "$slot_work/own.txt" ] || fail "the own pull request's write is not in the slot ($slot_work)"
[ ! -e "$slot_work/poison.txt" ] || fail "the fork's write reached the persistent slot"
K -n $jobs_ns delete scalepolicy slot --timeout=90s >/dev/null || fail "the slot policy was not deleted"
[ -z "$(ls -A "$HOST_ROOT/gates" 2>/dev/null)" ] || fail "job gates left: $(ls -A "$HOST_ROOT/gates")"
# What the gate costs a job's start: the broker's answers to the gate (its log's elapsed_ms: the
# attempt read and two GitHub reads through the proxy to the simulated GitHub).
gate_ms=$(K -n $ns logs -l app.kubernetes.io/component=operator --tail=-1 2>/dev/null \
  | jq -rR 'fromjson? | .fields // empty | select((.outcome // "") | startswith("job_")) | "\(.outcome) \(.elapsed_ms) ms"' \
  | paste -sd, - | sed 's/,/, /g')
say "fork gate on the real node: the own pull request ran on the slot, the fork's failed before its first step (JobRefused), its write not in the slot, no gate left; the broker's answers to the gate: ${gate_ms:-none in the operator log}"
no_leaks "fork gate"

# --- 2d. dependency caches on the real node (issue 31 item 2): an Ephemeral policy with a label of
# its own and npm's cache. Each runner's cache is an overlay the agent pod mounted under the host
# root, writable in the runner's unit only through its ReadWritePaths; the job gate's answer says
# whether the job's writes are kept. A push job fills the cache; a fork's pull request reads it
# and overwrites it in its own view; the next push job reads what the first one left.
labelled_policy cache "caches: {tools: [npm]}"
# cache_job NAME HEAD BEHAVIOUR: a job of the cache policy.
cache_job() { labelled_job cache "$@"; }
npm_file() { jq -n --arg c "$1" '{variable: "npm_config_cache", path: "pkg/index.js", content: $c}'; }
cache_live() { attempts | jq -e '[.items[] | select(.spec.policy == "cache" and .status.state != "Cleaned")] | length == 0' >/dev/null; }
cache_ns=$HOST_ROOT/caches/ns/$jobs_ns/github.com/acme/web
newest_gen() { ls "$cache_ns" 2>/dev/null | sed -n 's/^gen-//p' | sort -n | tail -1; }
fill=$(cache_job cache-fill - "{\"write_cache\": [$(npm_file good)]}")
wait_for 180 "the cache-filling push job (job $fill) completed" job_done "$fill"
[ "$(conclusion "$fill")" = success ] || fail "the cache-filling job failed: $(admin GET "jobs/$fill")"
wait_for 60 "the cache policy's attempts cleaned" cache_live
filled=$(newest_gen)
[ "$(cat "$cache_ns/gen-$filled/npm/pkg/index.js" 2>/dev/null)" = good ] || fail "the push job's cache write was not kept (generation ${filled:-none} of $cache_ns)"
poison=$(cache_job cache-fork mallory/web "{\"expect_cache\": [$(npm_file good)], \"write_cache\": [$(npm_file evil)]}")
wait_for 180 "the fork's pull request (job $poison) completed" job_done "$poison"
[ "$(conclusion "$poison")" = success ] || fail "the fork's job did not read the warm cache: $(admin GET "jobs/$poison")"
wait_for 60 "the cache policy's attempts cleaned" cache_live
[ "$(newest_gen)" = "$filled" ] || fail "the fork's cache writes were kept (generation $(newest_gen))"
check=$(cache_job cache-check - "{\"expect_cache\": [$(npm_file good)]}")
wait_for 180 "the checking push job (job $check) completed" job_done "$check"
[ "$(conclusion "$check")" = success ] || fail "the next push job did not read the trusted cache: $(admin GET "jobs/$check")"
wait_for 60 "the cache policy's attempts cleaned" cache_live
K -n $jobs_ns delete scalepolicy cache --timeout=90s >/dev/null || fail "the cache policy was not deleted"
[ -z "$(ls -A "$HOST_ROOT/caches/attempts" 2>/dev/null)" ] || fail "runners' caches left: $(ls -A "$HOST_ROOT/caches/attempts")"
[ "$(N awk '/ - overlay runner-cache / {n++} END {print n + 0}' /proc/1/mountinfo)" = 0 ] \
  || fail "a cache overlay is still mounted on the node: $(N grep ' - overlay runner-cache ' /proc/1/mountinfo)"
say "dependency caches on the real node: a push job's npm cache kept (generation $filled), a fork's pull request read it and its overwrite was discarded, the next push job read the trusted file, no runner cache or mount left"
no_leaks "dependency caches"

# --- 2e. Docker for jobs on the real node (issue 31 item 1): a policy with spec.docker, a job
# whose steps use its DOCKER_HOST as a workflow would (a build, a run, a `services:`-style
# container on a network of the job's reached by alias and by a port published on the node's
# loopback, a volume), are refused --privileged and -v /:/host with the reason, and go on after
# the agent is SIGKILLed mid-job (supervision serves the socket again). After the runner the
# engine's unit and directory are gone, and no process of an engine is left on the node.
if [ -n "${RM_DOCKER_CLI:-}" ]; then
  [ -x "$RM_DOCKER_CLI" ] && N test -x /usr/bin/podman || fail "Docker for jobs: no Docker CLI at RM_DOCKER_CLI ($RM_DOCKER_CLI) or no Podman on the node (e2e/docker/install.sh)"
  # The job's docker, where a runner's unit can read it (the node's own /var).
  install -d -m 0755 "$NODE_FS/var/lib/rm-e2e-docker"
  install -m 0755 "$RM_DOCKER_CLI" "$NODE_FS/var/lib/rm-e2e-docker/docker"
  labelled_policy docker "docker: {enabled: true}"
  d=/var/lib/rm-e2e-docker/docker
  steps=$(jq -n --arg d "$d" '[
    "cp /bin/busybox . && printf \"FROM scratch\\nCOPY busybox /bin/busybox\\nRUN [\\\"/bin/busybox\\\", \\\"--install\\\", \\\"-s\\\", \\\"/bin\\\"]\\n\" > Dockerfile && \($d) build -q -t app:1 .",
    "\($d) run --rm app:1 echo hello-from-a-container | grep -qx hello-from-a-container",
    "\($d) network create svc && \($d) volume create data",
    "\($d) run -d --name db --network svc --network-alias db -p 127.0.0.1:18080:80 -v data:/www app:1 sh -c \"echo served > /www/index.html && exec httpd -f -p 80 -h /www\"",
    "\($d) run --rm --network svc app:1 wget -qO- http://db/ | grep -qx served",
    "for i in $(seq 50); do /bin/busybox wget -qO- http://127.0.0.1:18080/ && break; sleep 0.2; done | grep -qx served",
    "! \($d) run --rm --privileged app:1 true 2> refused && grep -q \"privileged containers are refused\" refused",
    "! \($d) run --rm -v /:/host app:1 true 2> refused && grep -q \"bind mount of \\\"/\\\" is refused\" refused",
    "touch docker-steps-done; for i in $(seq 600); do [ -e agent-killed ] && break; sleep 0.2; done; [ -e agent-killed ]",
    "\($d) run --rm --network svc app:1 wget -qO- http://db/ | grep -qx served"
  ]')
  dj=$(labelled_job docker docker-job - "$(jq -n --argjson s "$steps" '{steps: $s}')")
  docker_attempt() { attempts | jq -r '[.items[] | select(.spec.policy == "docker")][0].spec.id // empty'; }
  steps_done() { local id; id=$(docker_attempt); [ -n "$id" ] && N test -e "/var/lib/runner-manager/runners/$(unit_of "$id" | sed 's/^rm-//; s/\.service$//')/_work/docker-steps-done"; }
  wait_for 240 "the Docker job's first steps (job $dj): build, run, a service by alias and port, the refusals" steps_done
  da=$(docker_attempt); hex=$(unit_of "$da" | sed 's/^rm-//; s/\.service$//')
  N systemctl is-active --quiet "rm-$hex-docker.service" || fail "the Docker job's engine unit rm-$hex-docker.service is not active"
  restarts() { K -n $ns get pods -l app.kubernetes.io/component=node-agent -o jsonpath='{.items[0].status.containerStatuses[0].restartCount}'; }
  before=$(restarts)
  N pkill -KILL -f '^/usr/bin/runner-manager-node-agent' || fail "no agent process to SIGKILL on the node"
  agent_back() { [ "$(restarts)" -gt "$before" ] && K -n $ns get pods -l app.kubernetes.io/component=node-agent -o jsonpath='{.items[0].status.containerStatuses[0].ready}' | grep -qx true; }
  wait_for 120 "the SIGKILLed agent restarted and Ready" agent_back
  N touch "/var/lib/runner-manager/runners/$hex/_work/agent-killed"
  wait_for 180 "the Docker job (job $dj) completed" job_done "$dj"
  [ "$(conclusion "$dj")" = success ] || { N cat "/var/lib/runner-manager/runners/$hex/_diag/"Worker_*.log 2>/dev/null | tail -20; fail "the Docker job failed: $(admin GET "jobs/$dj")"; }
  docker_clean() { attempts | jq -e '[.items[] | select(.spec.policy == "docker" and .status.state != "Cleaned")] | length == 0' >/dev/null; }
  wait_for 90 "the Docker policy's attempt cleaned" docker_clean
  [ -z "$(N systemctl list-units --all --plain --no-legend 'rm-*-docker.service')" ] || fail "an engine unit is left: $(N systemctl list-units --all --plain --no-legend 'rm-*-docker.service')"
  [ -z "$(ls -A "$HOST_ROOT/docker" 2>/dev/null)" ] || fail "an engine's directory is left: $(ls -A "$HOST_ROOT/docker")"
  for p in podman conmon slirp4netns aardvark-dns rootlessport httpd; do
    ! N pgrep -x "$p" >/dev/null || fail "a process of the job's engine is left on the node: $p ($(N pgrep -ax "$p"))"
  done
  K -n $jobs_ns delete scalepolicy docker --timeout=90s >/dev/null || fail "the docker policy was not deleted"
  say "Docker for jobs on the real node: job $dj built an image, ran a container, reached a service by alias and by a published port, was refused --privileged and -v /:/host with the reason, went on through its socket after the agent was SIGKILLed (restartCount $before -> $(restarts)); after it no engine unit, directory or process is left"
  no_leaks "docker"
else
  say "Docker for jobs on the real node: skipped (RM_DOCKER_CLI unset; make test sets it)"
fi

# --- 3. the agent pod deleted while a job runs
wait_for 90 "an idle runner" has_idle
long=$(queue_job long 20000)
wait_for 60 "job $long running" job_running "$long"
runner=$(admin GET "jobs/$long" | jq -r .runner_name)
busy=$(attempts | jq -r --arg r "$runner" '.items[] | select(.status.runner.name == $r) | .spec.id')
[ -n "$busy" ] || fail "no attempt holds runner $runner"
unit=$(unit_of "$busy")
inv=$(N systemctl show -P InvocationID "$unit")
old=$(K -n $ns get pods -l app.kubernetes.io/component=node-agent -o jsonpath='{.items[0].metadata.name}')
K -n $ns delete pod "$old" --wait=true >/dev/null
K -n $ns rollout status ds/$rel-runner-manager-node-agent --timeout=120s >/dev/null || fail "the agent did not come back after kubectl delete pod"
new=$(K -n $ns get pods -l app.kubernetes.io/component=node-agent -o jsonpath='{.items[0].metadata.name}')
[ "$new" != "$old" ] || fail "the agent pod was not replaced"
[ "$(N systemctl show -P InvocationID "$unit")" = "$inv" ] || fail "$unit was restarted with the agent"
say "kubectl delete pod $old while job $long ran on $unit: $new Ready, the unit untouched"
wait_for 60 "job $long completed" job_done "$long"
[ "$(admin GET "jobs/$long" | jq -r .conclusion)" = success ] || fail "job $long: $(admin GET "jobs/$long")"
[ "$(admin GET "jobs/$long" | jq -r .runner_name)" = "$runner" ] || fail "job $long changed runner"
state() { attempts | jq -r --arg id "$1" '.items[] | select(.spec.id == $id) | "\(.status.state)/\(.status.outcome.kind // "")"'; }
cleaned() { [ "$(state "$1")" = Cleaned/CompletedJob ]; }
wait_for 60 "attempt $busy Cleaned/CompletedJob" cleaned "$busy"
[ "$(attempts | jq -r --arg id "$busy" '.items[] | select(.spec.id == $id) | .status.runner.name')" = "$runner" ] \
  || fail "attempt $busy lost its runner"
say "job $long completed on the re-adopted runner $runner; its attempt Cleaned/CompletedJob"
no_leaks "agent restart"
# The jobs, a re-adopted runner and an agent restart are in the metrics now: what the chart and
# the docs give a platform team to watch them with must return data from a real Prometheus.
prom_check $jobs_ns web
# The collector back: launches since are traced again, joined across both binaries.
out=$(otel_traces any "$otel_file")
say "collector back: $out"

# --- 4. cordon, drain
wait_for 90 "an idle runner" has_idle
idle=$(attempts | jq -r '[.items[] | select(.status.state == "Idle")][0].spec.id')
K cordon "$RM_CLUSTER_NODE" >/dev/null
drained() {
  [ "$(attempts | jq -r --arg id "$idle" '.items[] | select(.spec.id == $id) | .spec.termination.reason // ""')" = Drain ] &&
  [ "$(state "$idle" | cut -d/ -f1)" = Cleaned ] && ! N systemctl is-active --quiet "$(unit_of "$idle")"
}
wait_for 90 "the idle runner of a cordoned node drained" drained
wait_for 30 "no live attempt on the cordoned node" no_live
say "kubectl cordon: idle runner $(unit_of "$idle") drained (termination Drain), nothing placed"
no_leaks "cordon"
K drain "$RM_CLUSTER_NODE" --ignore-daemonsets --delete-emptydir-data --timeout=90s >/dev/null 2>&1 \
  || fail "kubectl drain did not complete"
[ -z "$(live_ids)" ] || fail "an attempt was placed on the drained node"
say "kubectl drain: operator evicted, agent (DaemonSet) kept, no attempt"
K uncordon "$RM_CLUSTER_NODE" >/dev/null
K -n $ns rollout status deploy/$rel-runner-manager-operator --timeout=120s >/dev/null || fail "the operator did not come back after uncordon"
K -n kube-system rollout status deploy/coredns --timeout=60s >/dev/null || fail "the cluster DNS did not come back after uncordon"
wait_for 90 "an idle runner after uncordon" has_idle
say "kubectl uncordon: operator back, a new idle runner"
no_leaks "uncordon"

# --- 5. helm upgrade to images of another digest
variant=$work/images-upgrade
RM_IMAGES=$variant RM_IMAGE_VARIANT=upgrade "$root/e2e/images/build.sh" >/dev/null
RM_IMAGES=$variant "$here/load-images.sh" >/dev/null
op2=$(sed -n 2p "$variant/operator.ref") ag2=$(sed -n 2p "$variant/node-agent.ref")
[ "$ag2" != "$ag" ] && [ "$op2" != "$op" ] || fail "the upgrade images have the same digests"
idle=$(attempts | jq -r '[.items[] | select(.status.state == "Idle")][0].spec.id')
inv=$(N systemctl show -P InvocationID "$(unit_of "$idle")")
H upgrade $rel "${RM_CHART:-$root/charts/runner-manager}" -n $ns "${values[@]}" "${tuning[@]}" \
  --set "image.operator.digest=${op2#*@}" --set "image.nodeAgent.digest=${ag2#*@}" >/dev/null
K -n $ns rollout status deploy/$rel-runner-manager-operator --timeout=120s >/dev/null || fail "the upgraded operator is not Ready"
K -n $ns rollout status ds/$rel-runner-manager-node-agent --timeout=120s >/dev/null || fail "the upgraded agent is not Ready"
images=$(K -n $ns get pods -o jsonpath='{range .items[*]}{.spec.containers[0].image}{"\n"}{end}' | sort -u)
case "$images" in *"${ag2#*@}"*) ;; *) fail "the agent pod does not run ${ag2#*@}: $images" ;; esac
case "$images" in *"${op2#*@}"*) ;; *) fail "the operator pod does not run ${op2#*@}: $images" ;; esac
readopted() { [ "$(state "$idle" | cut -d/ -f1)" = Idle ]; }
wait_for 30 "the idle runner re-adopted after the upgrade" readopted
[ "$(N systemctl show -P InvocationID "$(unit_of "$idle")")" = "$inv" ] || fail "the idle runner's unit was restarted by the upgrade"
say "helm upgrade to operator ${op2#*@}, agent ${ag2#*@}: both rolled, idle runner $(unit_of "$idle") kept"
no_leaks "helm upgrade"

# --- 6. the policy deleted, then helm uninstall
K -n $jobs_ns delete scalepolicy web --timeout=90s >/dev/null || fail "the ScalePolicy was not deleted (its runners not drained)"
wait_for 60 "no live attempt after the policy's deletion" no_live
# Nothing secret in any span the collector received (every JIT minted, the webhook secret, the
# App's key, the tenant's runner.env; anything shaped like a token, a JWT or a key).
otel_secrets "$work/secrets"
cat "$work"/traces-*.jsonl > "$work/traces-all.jsonl"
out=$(otel_traces scan "$work/traces-all.jsonl" "$work/secrets")
say "OpenTelemetry Collector: $out"
# Every JIT ever minted journalled or deregistered, no registration left (while the operator runs).
jits=$(jits_accounted "policy deleted" $jobs_ns "$work/attempts.rec")
stop_recording
say "ScalePolicy deleted: $jits"
H uninstall $rel -n $ns >/dev/null
no_pods() { [ -z "$(K -n $ns get pods -o name 2>/dev/null)" ]; }
wait_for 60 "no pod after helm uninstall" no_pods
[ -z "$(units)" ] || fail "units left on the node after helm uninstall: $(units | tr '\n' ' ')"
# Dot entries too: an overlay's workdir (.overlay-work/<id>) goes with its runtime and the probe's
# (.overlay-probe-*) at once, so nothing of the agent's may stay after uninstall.
[ -z "$(ls -A "$HOST_ROOT/runners" 2>/dev/null)" ] || fail "runtime directories left: $(ls -A "$HOST_ROOT/runners")"
[ "$(N awk '$5 ~ "^/var/lib/runner-manager" {n++} END {print n + 0}' /proc/1/mountinfo)" = 0 ] \
  || fail "mounts left under /var/lib/runner-manager on the node after helm uninstall"
# Nor anywhere else on the node (an agent's overlay is recognised by its source).
[ "$(N awk '/ - overlay runner-package / {n++} END {print n + 0}' /proc/1/mountinfo)" = 0 ] \
  || fail "runtime overlays left on the node after helm uninstall: $(N grep ' - overlay runner-package ' /proc/1/mountinfo)"
[ "$(admin GET runners | jq length)" = 0 ] || fail "registrations left on the simulated GitHub: $(admin GET runners)"
[ -z "$(handoffs)" ] || fail "JIT handoff files left: $(handoffs | tr '\n' ' ')"
[ -z "$(ls -A "$HOST_ROOT/gates" 2>/dev/null)" ] || fail "job gates left: $(ls -A "$HOST_ROOT/gates")"
say "ScalePolicy deleted, helm uninstall: no pod, unit, runtime directory, mount (overlay or other) on the node, registration or handoff file left"
echo "cluster/helm-check.sh: all checks passed"
