# Sourced by e2e/cluster/helm-check.sh (after env.sh, with say, fail, wait_for, $work, $root and
# $here defined): a real OpenTelemetry Collector (e2e/otelcol, built from its Go modules) that the
# installed product exports its traces to, and what the traces must show (issue 33 item 1,
# e2e/cluster/traces.py).
# The collector listens on the node's address, in the node's network namespace (the place a
# node-local collector has; pods reach it as they reach their node), not on the host end of the
# veth: that address is the simulated GitHub's, which the install reaches through its proxy,
# while the collector is on the proxy's NO_PROXY list as any in-cluster collector is.
# Each start writes a new file: $work/traces-<n>.jsonl (OTLP JSON, one export request a line).

otel_pid=
otel_runs=0
otel_port=${RM_OTELCOL_PORT:-14318}
otel_endpoint=http://$NODE_IP:$otel_port
otel_file=
otel_bin=

# otel_start: the collector (built, or its cached build: $otel_bin) started by pid in the
# node's network namespace (its files on the host); waits until it accepts an OTLP request.
otel_start() {
  otel_bin=$("$root/e2e/otelcol/build.sh") || fail "the OpenTelemetry Collector did not build (e2e/otelcol/build.sh)"
  otel_runs=$((otel_runs + 1))
  otel_file=$work/traces-$otel_runs.jsonl
  cat > "$work/otelcol.yaml" <<CONF
receivers:
  otlp:
    protocols:
      http:
        endpoint: $NODE_IP:$otel_port
exporters:
  file:
    path: $otel_file
service:
  telemetry:
    logs: {level: warn}
    metrics: {level: none}
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
CONF
  "$otel_bin" validate --config="file:$work/otelcol.yaml" >/dev/null || fail "otelcol validate: $work/otelcol.yaml"
  # --net only: nsenter execs the collector (no fork), so $! is its pid.
  nsenter --target "$(cat "$NODE_STATE/pid")" --net -- "$otel_bin" --config="file:$work/otelcol.yaml" \
    >>"$work/otelcol.log" 2>&1 &
  otel_pid=$!
  wait_for 30 "the OpenTelemetry Collector accepting OTLP at $otel_endpoint ($work/otelcol.log)" \
    N curl -fsS -o /dev/null -X POST -H 'Content-Type: application/json' -d '{}' "$otel_endpoint/v1/traces"
}

otel_stop() {
  [ -z "$otel_pid" ] || { kill "$otel_pid" 2>/dev/null || true; wait "$otel_pid" 2>/dev/null || true; }
  otel_pid=
}

# otel_secrets FILE: what no exported span may hold, one value a line: every JIT the simulated
# GitHub minted, the webhook secret, the GitHub App's private key (its base64 lines), the tenant's
# runner.env value.
otel_secrets() {
  { admin GET jits | jq -r '.[]'
    echo "$webhook_secret"
    grep -v -- '-----' "$work/app.pem"
    echo "$tenant_marker"
  } > "$1"
}

# otel_span_counts URL: the binary's trace_spans_* samples at that /metrics URL (one line each).
otel_span_counts() {
  N curl -fsS "$1" | grep -E '^runner_manager_(agent_)?trace_spans_(exported|dropped)_total' || true
}

# otel_traces ARGS...: e2e/cluster/traces.py ARGS until it passes (each binary exports its spans
# in batches, every 5 s), for up to 30 s; prints its report, or fails with its last reason.
otel_traces() {
  local out
  for _ in $(seq 1 60); do
    out=$(python3 "$here/traces.py" "$@" 2>&1) && { echo "$out"; return 0; }
    sleep 0.5
  done
  fail "the OpenTelemetry Collector's traces: $out"
}

# otel_dropped PREFIX: trace_spans_dropped_total{reason="export_failed"} summed over the
# ServiceMonitor's targets whose metrics carry PREFIX (runner_manager_ for the operator,
# runner_manager_agent_ for the agents).
otel_dropped() {
  local a
  for a in $(jq -r '.[].targets[0]' "$work/prometheus-targets.json"); do N curl -fsS "http://$a/metrics" || true; done \
    | awk -v m="${1}trace_spans_dropped_total{reason=\"export_failed\"}" '$1 == m { s += $2 } END { print s + 0 }'
}
