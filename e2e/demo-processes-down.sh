#!/usr/bin/env bash
# Stops what `make demo-processes` started — the agents, the operator, the simulated GitHub
# (each by the pid it recorded), every runner process the demo's agents launched (found by its
# working directory under the demo's host roots: runners outlive their agent by design), then the
# control plane. `--quiet` says nothing when there is nothing to stop.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/e2e/control-plane/env.sh"
export RM_RUN="$RM_CACHE/demo-run"
demo="$RM_RUN/demo"
quiet=false
[ "${1:-}" = --quiet ] && quiet=true
if [ -d "$demo" ]; then
  for f in "$demo"/agent-*.pid "$demo"/operator.pid "$demo"/fake-github.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null
      $quiet || echo "stopped $(basename "$f" .pid) (pid $pid)"
    fi
    rm -f "$f"
  done
  for proc in /proc/[0-9]*; do
    cwd=$(readlink "$proc/cwd" 2>/dev/null) || continue
    case "$cwd" in
      "$demo"/*|/var/lib/runner-manager-demo/*) kill -KILL "${proc#/proc/}" 2>/dev/null && { $quiet || echo "stopped runner process ${proc#/proc/}"; } ;;
    esac
  done
fi
if $quiet; then
  "$root/e2e/control-plane/stop.sh" >/dev/null 2>&1
else
  "$root/e2e/control-plane/stop.sh"
fi
