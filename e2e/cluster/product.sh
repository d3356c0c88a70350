# Sourced by e2e/cluster/helm-check.sh and e2e/demo.sh (after env.sh, with K and H defined): the
# product installed the way a user installs it, against the simulated GitHub where the node's
# pods reach it (the host end of the node's veth, $HOST_IP).

# start_fake_github DIR: target/debug/fake-github bound to $HOST_IP, serving the stand-in runner
# package built into DIR/package; log DIR/fake-github.log, pid DIR/fake-github.pid. Sets $gh (its
# base URL) and $fake_pid.
start_fake_github() {
  local dir=$1 bin
  bin=$(cd "$here_cluster/../.." && pwd)/target/debug/fake-github
  [ -x "$bin" ] || { echo "no $bin: cargo build --workspace --bins" >&2; return 1; }
  mkdir -p "$dir"
  "$bin" --bind "$HOST_IP" --package-dir "$dir/package" >"$dir/fake-github.log" 2>&1 &
  fake_pid=$!
  echo "$fake_pid" > "$dir/fake-github.pid"
  for _ in $(seq 1 100); do grep -q '^listening on ' "$dir/fake-github.log" && break; sleep 0.1; done
  gh=$(sed -n 's/^listening on //p' "$dir/fake-github.log" | head -1)
  [ -n "$gh" ] || { echo "fake-github did not start: $dir/fake-github.log" >&2; return 1; }
}

# admin METHOD PATH [JSON]: the simulated GitHub's admin API.
admin() { curl -fsS -X "$1" -H 'content-type: application/json' "$gh/_admin/$2" ${3:+-d "$3"}; }

# github_app DIR: a GitHub App (id 4242, key DIR/app.pem) installed on the account `acme`.
github_app() {
  openssl genrsa -out "$1/app.pem" 2048 2>/dev/null
  admin POST app "$(jq -n --rawfile k <(openssl rsa -in "$1/app.pem" -pubout 2>/dev/null) '{app_id: 4242, public_key_pem: $k}')" >/dev/null
  admin POST installations '{"id": 777, "account": "acme"}' >/dev/null
}

# The chart's values for a test GitHub: its API URL, plain http to its one host (operator and
# agent), package downloads from it. Production leaves allowHttpHosts empty. Set by chart_values.
# The runners' network filter gets the test cluster's own ranges (the chart's defaults cover
# them too, wider).
chart_values() {
  values=(--set "operator.githubApiUrl=$gh" --set "operator.allowHttpHosts=$HOST_IP"
    --set "operator.downloadHosts=$HOST_IP" --set "nodeAgent.allowHttpHosts=$HOST_IP"
    --set-json "nodeAgent.runnerNetwork.podCIDRs=[\"$RM_CLUSTER_POD_CIDR\"]"
    --set-json "nodeAgent.runnerNetwork.serviceCIDRs=[\"$RM_CLUSTER_SERVICE_CIDR\"]")
}

# fullname RELEASE: the base of the chart's object names (_helpers.tpl's rm.fullname: the release
# name when it contains the chart's name, else RELEASE-runner-manager).
fullname() { case "$1" in *runner-manager*) echo "$1" ;; *) echo "$1-runner-manager" ;; esac; }

# install_product RELEASE NAMESPACE [helm args...]: the webhook Secret, then `helm install` of
# the chart (the directory, or the packaged archive RM_CHART names) with the project's images by digest (e2e/images/build.sh) and the node's imported
# pause image for placeholder pods (nothing is pulled); waits for both rollouts,
# then points the simulated GitHub's webhook deliveries at the webhook Service's ClusterIP (the
# host routes the Service range through the node). Sets $webhook_secret.
install_product() {
  local rel=$1 ns=$2 op ag hook fn; shift 2
  fn=$(fullname "$rel")
  op=$(sed -n 2p "$RM_IMAGES/operator.ref") ag=$(sed -n 2p "$RM_IMAGES/node-agent.ref")
  webhook_secret=$(openssl rand -hex 20)
  K create ns "$ns" --dry-run=client -o yaml | K apply -f - >/dev/null
  K -n "$ns" create secret generic "$fn-webhook" --from-literal=secret="$webhook_secret" \
    --dry-run=client -o yaml | K apply -f - >/dev/null
  chart_values
  # --force-conflicts: CRDs kept from an earlier install were re-applied by its operator (its field manager).
  H install "$rel" "${RM_CHART:-$here_cluster/../../charts/runner-manager}" -n "$ns" --force-conflicts "${values[@]}" \
    --set "image.operator.digest=${op#*@}" --set "image.nodeAgent.digest=${ag#*@}" \
    --set "placeholders.image=$(sed -n 1p "$RM_IMAGES/pause.ref")" "$@" \
    >/dev/null 2> >(grep -v 'unrecognized format' >&2)
  K -n "$ns" rollout status "deploy/$fn-operator" --timeout=120s >/dev/null || return 1
  K -n "$ns" rollout status "ds/$fn-node-agent" --timeout=120s >/dev/null || return 1
  hook=$(K -n "$ns" get svc "$fn-webhook" -o jsonpath='{.spec.clusterIP}')
  admin POST webhooks "$(jq -n --arg u "http://$hook:8080/webhook" --arg s "$webhook_secret" '{url: $u, secret: $s}')" >/dev/null
}

# apply_policy NAMESPACE NAME MIN_IDLE MAX_RUNNERS KEY_PEM [RUNNER_ENV]: the App's Secret and a
# ScalePolicy for acme/web; with RUNNER_ENV (`NAME=value` lines), a ConfigMap `NAME-env` holding
# it as `runner.env`, the policy's runner environment.
apply_policy() {
  local env_from=
  K create ns "$1" --dry-run=client -o yaml | K apply -f - >/dev/null
  K -n "$1" create secret generic github-app --from-literal=appId=4242 --from-file=privateKey="$5" \
    --dry-run=client -o yaml | K apply -f - >/dev/null
  if [ -n "${6:-}" ]; then
    K -n "$1" create configmap "$2-env" --from-literal=runner.env="$6" \
      --dry-run=client -o yaml | K apply -f - >/dev/null
    env_from=", envFrom: {configMapRef: {name: $2-env}}"
  fi
  K -n "$1" apply -f - >/dev/null <<YAML
apiVersion: runner-manager.dev/v1alpha1
kind: ScalePolicy
metadata: {name: $2}
spec:
  github: {url: "https://github.com/acme/web", credentialsSecretRef: {name: github-app}}
  labels: [self-hosted, linux, x64]
  minIdle: $3
  maxRunners: $4
  runner: {version: latest$env_from}
YAML
}

# queue_job NAME DURATION_MS: a job on acme/web; prints its id.
queue_job() {
  admin POST jobs "$(jq -n --arg n "$1" --argjson d "$2" '{owner: "acme", repo: "web", labels: ["self-hosted", "linux"], name: $n, behaviour: {duration_ms: $d}}')" | jq -r .job_id
}

# settle SECONDS WHAT LISTER...: runs LISTER (it prints what is still wrong, one item a line, and
# nothing once all is well) every 0.5 s until it prints nothing; fails naming WHAT and what it
# printed last. A leak is what stays: something seen between two states (a runtime listed a
# moment before its attempt's Cleaned, a registration minted a moment before its journal write)
# passes once it settles, and fails only if it never does.
settle() {
  local n=$(( $1 * 2 )) what=$2 out=; shift 2
  for _ in $(seq 1 "$n"); do
    if out=$("$@" 2>&1) && [ -z "$out" ]; then return 0; fi
    sleep 0.5
  done
  fail "$what (still after $(( n / 2 )) s): $(echo "$out" | tr '\n' ' ')"
}

# record_attempts NAMESPACE FILE: appends every attempt of NAMESPACE the API server shows, at
# every change, as `uuid|name|runner name|runner id|state` to FILE (attempts are deleted with
# their policy; the JITs minted for them are not). The watch is opened again when it ends (an
# API server restart ends it), so nothing is missed for longer than the gap, and jit_ledger
# records the current list at each look as well. Sets $record_pid; stop_recording ends it.
record_attempts() {
  local ns=$1 file=$2
  (
    k=
    trap '[ -z "$k" ] || kill "$k" 2>/dev/null; exit 0' TERM
    while :; do
      K -n "$ns" get ra --watch \
        -o jsonpath='{.spec.id}|{.metadata.name}|{.status.runner.name}|{.status.runner.id}|{.status.state}{"\n"}' >> "$file" 2>/dev/null &
      k=$!
      wait "$k" || true
      k=
      sleep 1
    done
  ) &
  record_pid=$!
}
stop_recording() { [ -z "${record_pid:-}" ] || kill "$record_pid" 2>/dev/null || true; record_pid=; }

# jit_ledger NAMESPACE FILE: every JIT the simulated GitHub minted (its /_admin/mints) joined with
# the attempts' journal (FILE of record_attempts, with NAMESPACE's attempts as they are now
# appended), and its registrations with the live attempts; one JSON object. Each mint belongs to
# the attempt its runner name derives from (runner-manager-<attempt uuid>) and is `journalled`
# (the attempt's status.runner is that registration), `discarded` (deregistered before its JIT
# reached a runner: a CAS the broker lost, a mint retried), or still `pending` (minted, neither
# journalled nor deregistered yet: the broker's write in flight, or a leak once it stays);
# `unowned` if no attempt has its uuid. Immediate failures: an attempt that journalled `twice`
# (two runner ids) and a JIT `reused` (more than one session opened with it, or a JIT other than
# the journalled one that reached a runner). `strays`: registrations of no live attempt, except
# the names in $abandoned.
jit_ledger() {
  local now mints regs
  now=$(K -n "$1" get ra -o json) || return 1
  jq -r '.items[] | "\(.spec.id)|\(.metadata.name)|\(.status.runner.name // "")|\(.status.runner.id // "")|\(.status.state // "")"' <<<"$now" >> "$2"
  mints=$(admin GET mints) || return 1
  regs=$(admin GET runners) || return 1
  jq -cn --argjson mints "$mints" --argjson regs "$regs" --argjson now "$now" --rawfile rec "$2" --arg abandoned "${abandoned:-}" '
    ($rec | split("\n") | map(select(length > 0) | split("|") | {id: .[0], name: .[1], rid: (.[3] // "")})
      | map(select(.id != "")) | group_by(.id)
      | map({key: .[0].id, value: {name: .[0].name, rids: ([.[].rid | select(. != "")] | unique)}}) | from_entries) as $att
    | [$now.items[] | select(.status.state != "Cleaned") | .spec.id] as $live
    | ($abandoned | split(" ") | map(select(length > 0))) as $ab
    | [$mints[] | . as $m | ($m.name | ltrimstr("runner-manager-")) as $u | $att[$u] as $a
       | {name: $m.name, id: $m.id, sessions: $m.sessions, registered: $m.registered, attempt: ($a.name // null),
          verdict: (if $a == null then "unowned"
            elif ($a.rids | length) > 1 then "twice"
            elif $m.sessions > 1 then "reused"
            elif ($a.rids | length) == 1 and $a.rids[0] == ($m.id | tostring) then "journalled"
            elif ($a.rids | length) == 1 and $m.sessions > 0 then "reused"
            elif ($m.registered | not) and $m.sessions == 0 then "discarded"
            else "pending" end)}] as $v
    | def named(k): [$v[] | select(.verdict == k) | "\(.name) (id \(.id), attempt \(.attempt // "none"), sessions \(.sessions), registered \(.registered))"];
    {minted: ($v | length), journalled: named("journalled") | length, discarded: named("discarded") | length,
     attempts: ([$att[] | select(.rids | length > 0)] | length),
     pending: named("pending"), unowned: named("unowned"), twice: named("twice"), reused: named("reused"),
     strays: [$regs[] | select((.name | ltrimstr("runner-manager-")) as $u | any($live[]; . == $u) | not)
              | select(.name as $n | any($ab[]; . == $n) | not) | .name]}'
}

# jits_accounted WHAT NAMESPACE FILE [SECONDS]: waits (90 s unless told) until every JIT minted
# is journalled by its attempt or deregistered unused, and every registration belongs to a live
# attempt (or is in $abandoned); fails at once on an attempt with two runners or a JIT used
# twice. Prints the count; sets $ledger to the last ledger.
jits_accounted() {
  local what=$1 ns=$2 file=$3 n=$(( ${4:-90} * 2 )) first= start
  ledger=
  start=$(date +%s%3N)
  for _ in $(seq 1 "$n"); do
    ledger=$(jit_ledger "$ns" "$file") || { sleep 0.5; continue; }
    [ "$(jq '.twice + .reused | length' <<<"$ledger")" = 0 ] \
      || fail "$what: a runner started twice: attempts with two runners: $(jq -c .twice <<<"$ledger"); JITs used twice or not the journalled one: $(jq -c .reused <<<"$ledger")"
    [ "$(jq '.pending + .unowned + .strays | length' <<<"$ledger")" = 0 ] && break
    # What was unsettled at the first look: the evidence of what an instant comparison misread.
    [ -n "$first" ] || first=$(jq -c '{pending, unowned, strays}' <<<"$ledger")
    sleep 0.5
  done
  [ -n "$ledger" ] || fail "$what: neither the simulated GitHub nor the API server answered for $(( n / 2 )) s"
  [ "$(jq '.unowned | length' <<<"$ledger")" = 0 ] || fail "$what: JITs minted for no attempt recorded: $(jq -c .unowned <<<"$ledger")"
  [ "$(jq '.pending | length' <<<"$ledger")" = 0 ] || fail "$what: JITs minted, neither journalled by their attempt nor deregistered after $(( n / 2 )) s: $(jq -c .pending <<<"$ledger")"
  [ "$(jq '.strays | length' <<<"$ledger")" = 0 ] || fail "$what: registrations of no live attempt after $(( n / 2 )) s: $(jq -c .strays <<<"$ledger")"
  printf '%s%s\n' "$(jq -r '"\(.minted) JIT(s) minted: \(.journalled) journalled by \(.attempts) attempt(s), \(.discarded) deregistered unused"' <<<"$ledger")" \
    "${first:+ (settled after $(( ($(date +%s%3N) - start) / 1000 )) s; unsettled at the first look: $first)}"
}

# The real-node checks' shared steps (each check defines K, fail, and jobs_ns, its jobs'
# namespace; fail dumps that check's own logs).
# wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.5 s until it succeeds.
wait_for() {
  local n=$(( $1 * 2 )) what=$2; shift 2
  for _ in $(seq 1 "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  fail "waited $(( n / 2 )) s for: $what"
}

# drop_jobs_ns [TIMEOUT]: deletes the jobs' namespace (waiting TIMEOUT seconds, 90 by default).
# It goes before the operator: its policies and attempts carry the operator's finalizers (a
# namespace deleted after `helm uninstall` stays Terminating); left by a run that died without
# its operator, their finalizers are dropped by hand.
drop_jobs_ns() {
  K get ns $jobs_ns >/dev/null 2>&1 || return 0
  K delete ns $jobs_ns --timeout="${1:-90}s" >/dev/null 2>&1 && return 0
  for o in $(K -n $jobs_ns get scalepolicies,runnerattempts -o name 2>/dev/null); do
    K -n $jobs_ns patch "$o" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
  done
  K wait --for=delete ns/$jobs_ns --timeout=30s >/dev/null 2>&1 || true
}
