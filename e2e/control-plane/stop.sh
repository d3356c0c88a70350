#!/usr/bin/env bash
# Stop what start.sh started, by pid, scheduler and controller manager first; wait for each to exit.
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
# Alive: there and not a zombie (this host's PID 1 reaps orphans only every couple of seconds, and
# kill -0 succeeds on a zombie: waiting for it cost ~3 s per process).
alive() { [ -r "/proc/$1/stat" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null; }
for f in scheduler kcm apiserver etcd; do
  pidfile="$RM_RUN/$f.pid"
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
    alive "$pid" && kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
done
exit 0
