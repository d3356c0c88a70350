#!/usr/bin/env bash
# Stop what start.sh started, by pid, scheduler and controller manager first; wait for each to exit.
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
for f in scheduler kcm apiserver etcd; do
  pidfile="$RM_RUN/$f.pid"
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
done
exit 0
