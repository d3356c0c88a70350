# Sourced by e2e/cluster/helm-check.sh (after env.sh and product.sh, with K, H, say, fail,
# wait_for, $work, $rel, $ns, $root, $here and the chart's $values defined): a real Prometheus
# (Debian's package, e2e/cluster/install-packages.sh) on the host, scraping the installed
# product the way the chart's ServiceMonitor tells Prometheus Operator to (e2e/cluster/prometheus.py),
# and what a platform team is given to watch it with evaluated there (issue 33 item 2).

prom_pid=
prom_sd_pid=
prom_url=
# prom_start: the chart's ServiceMonitor rendered with the install's values, turned into a
# scrape configuration (every 2 s), its targets resolved, Prometheus started by pid (stopped by
# prom_stop, which helm-check.sh's cleanup calls).
prom_start() {
  local port=${RM_PROMETHEUS_PORT:-19090}
  command -v prometheus >/dev/null && command -v promtool >/dev/null \
    || fail "no prometheus or promtool: e2e/cluster/install-packages.sh installs Debian's prometheus"
  H template $rel "${RM_CHART:-$root/charts/runner-manager}" -n $ns "${values[@]}" --set serviceMonitor.enabled=true \
    --show-only templates/servicemonitor.yaml > "$work/servicemonitor.yaml" || fail "the chart rendered no ServiceMonitor"
  python3 "$here/prometheus.py" config "$work/servicemonitor.yaml" "$work/prometheus-targets.json" 2s \
    > "$work/prometheus.yml" || fail "no scrape configuration from the chart's ServiceMonitor"
  prom_targets >/dev/null
  # Discovery, as Prometheus' own Kubernetes discovery would: the targets file follows the pods
  # (the scenario replaces the agent's pod three times), every 2 s, until prom_stop.
  ( while sleep 2; do prom_resolve >/dev/null 2>&1 || true; done ) &
  prom_sd_pid=$!
  promtool check config "$work/prometheus.yml" >/dev/null || fail "promtool check config: $work/prometheus.yml"
  rm -rf "$work/prometheus-data"
  prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prometheus-data" \
    --web.listen-address="127.0.0.1:$port" --log.level=warn >"$work/prometheus.log" 2>&1 &
  prom_pid=$!
  prom_url=http://127.0.0.1:$port
  prom_started=$(date +%s)
  wait_for 30 "Prometheus ready at $prom_url ($work/prometheus.log)" curl -fsS "$prom_url/-/ready"
}

prom_stop() {
  [ -z "$prom_sd_pid" ] || { kill "$prom_sd_pid" 2>/dev/null || true; wait "$prom_sd_pid" 2>/dev/null || true; }
  [ -z "$prom_pid" ] || { kill "$prom_pid" 2>/dev/null || true; wait "$prom_pid" 2>/dev/null || true; }
  prom_pid= prom_sd_pid=
}

# prom_resolve: the ServiceMonitor's targets as the API server has them now (a replaced pod has
# another address), into the file Prometheus watches. Prints them. prom_targets fails the check
# when they cannot be resolved; the discovery loop tries again 2 s later.
prom_resolve() {
  KUBECTL="$RM_TOOLS_BIN/kubectl" python3 "$here/prometheus.py" targets "$work/servicemonitor.yaml" \
    "$work/prometheus-targets.json"
}
prom_targets() { prom_resolve || fail "the ServiceMonitor's targets could not be resolved"; }

# Every target in the file is up in Prometheus, scraped after $1 (unix seconds).
prom_scraped_since() {
  local want
  want=$(jq length "$work/prometheus-targets.json")
  [ "$want" -ge 2 ] || return 1
  curl -fsS "$prom_url/api/v1/query" --data-urlencode "query=count(timestamp(up == 1) > $1)" \
    | jq -e --arg n "$want" '.data.result[0].value[1] == $n' >/dev/null
}

# prom_check NAMESPACE POLICY: once the jobs ran. Both binaries' endpoints pass `promtool check
# metrics` (their Prometheus text format); every dashboard panel and variable and every alert
# example of docs/observability.md returns series for that policy (e2e/cluster/prometheus.py
# queries); the alert examples pass `promtool check rules`.
prom_check() {
  local now addr body listed window out
  listed=$(prom_targets)
  now=$(date +%s)
  wait_for 30 "Prometheus scraping every target of the ServiceMonitor ($listed) up after the jobs" prom_scraped_since "$now"
  for addr in $(jq -r '.[].targets[0]' "$work/prometheus-targets.json"); do
    body=$(curl -fsS -H 'Accept: text/plain; version=0.0.4' "http://$addr/metrics") || fail "GET http://$addr/metrics"
    out=$(promtool check metrics <<<"$body" 2>&1) || fail "promtool check metrics on http://$addr/metrics: $out"
  done
  say "Prometheus scrapes the chart's ServiceMonitor targets ($listed); promtool check metrics is clean on each"
  window=$(( $(date +%s) - prom_started + 60 ))s
  out=$(python3 "$here/prometheus.py" queries "$prom_url" "$root/charts/runner-manager/dashboards/runner-manager.json" \
    "$root/docs/observability.md" "$window" "$1" "$2" 2>&1) || fail "queries against a real Prometheus: $out"
  echo "$out"
  python3 "$here/prometheus.py" rules "$root/docs/observability.md" > "$work/alerts.yml"
  out=$(promtool check rules "$work/alerts.yml" 2>&1) || fail "promtool check rules on docs/observability.md's alert examples: $out"
  say "every dashboard panel and variable and every alert example returns series for $1/$2 (window $window); promtool check rules: $(grep -o '[0-9]* rules found' <<<"$out")"
}
