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
chart_values() {
  values=(--set "operator.githubApiUrl=$gh" --set "operator.allowHttpHosts=$HOST_IP"
    --set "operator.downloadHosts=$HOST_IP" --set "nodeAgent.allowHttpHosts=$HOST_IP")
}

# fullname RELEASE: the base of the chart's object names (_helpers.tpl's rm.fullname: the release
# name when it contains the chart's name, else RELEASE-runner-manager).
fullname() { case "$1" in *runner-manager*) echo "$1" ;; *) echo "$1-runner-manager" ;; esac; }

# install_product RELEASE NAMESPACE [helm args...]: the webhook Secret, then `helm install` of
# the chart with the project's images by digest (e2e/images/build.sh) and the node's imported
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
  H install "$rel" "$here_cluster/../../charts/runner-manager" -n "$ns" --force-conflicts "${values[@]}" \
    --set "image.operator.digest=${op#*@}" --set "image.nodeAgent.digest=${ag#*@}" \
    --set "placeholders.image=$(sed -n 1p "$RM_IMAGES/pause.ref")" "$@" \
    >/dev/null 2> >(grep -v 'unrecognized format' >&2)
  K -n "$ns" rollout status "deploy/$fn-operator" --timeout=120s >/dev/null || return 1
  K -n "$ns" rollout status "ds/$fn-node-agent" --timeout=120s >/dev/null || return 1
  hook=$(K -n "$ns" get svc "$fn-webhook" -o jsonpath='{.spec.clusterIP}')
  admin POST webhooks "$(jq -n --arg u "http://$hook:8080/webhook" --arg s "$webhook_secret" '{url: $u, secret: $s}')" >/dev/null
}

# apply_policy NAMESPACE NAME MIN_IDLE MAX_RUNNERS KEY_PEM: the App's Secret and a ScalePolicy for acme/web.
apply_policy() {
  K create ns "$1" --dry-run=client -o yaml | K apply -f - >/dev/null
  K -n "$1" create secret generic github-app --from-literal=appId=4242 --from-file=privateKey="$5" \
    --dry-run=client -o yaml | K apply -f - >/dev/null
  K -n "$1" apply -f - >/dev/null <<YAML
apiVersion: runner-manager.dev/v1alpha1
kind: ScalePolicy
metadata: {name: $2}
spec:
  github: {url: "https://github.com/acme/web", credentialsSecretRef: {name: github-app}}
  labels: [self-hosted, linux, x64]
  minIdle: $3
  maxRunners: $4
  runner: {version: latest}
YAML
}

# queue_job NAME DURATION_MS: a job on acme/web; prints its id.
queue_job() {
  admin POST jobs "$(jq -n --arg n "$1" --argjson d "$2" '{owner: "acme", repo: "web", labels: ["self-hosted", "linux"], name: $n, behaviour: {duration_ms: $d}}')" | jq -r .job_id
}
