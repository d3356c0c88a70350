#!/usr/bin/env bash
# Stops the private systemd of e2e/systemd/start.sh and removes every trace: the processes of
# its pid namespace, its cgroups in every hierarchy, its state directory. Signals only the pid
# start.sh recorded, after checking it is that systemd, PID 1 of another pid namespace.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../control-plane/env.sh"
STATE=${RM_SYSTEMD_STATE:-$RM_CACHE/systemd}
[ -d "$STATE" ] || exit 0
CG=$(cat "$STATE/cgroup" 2>/dev/null || echo "${RM_SYSTEMD_CGROUP:-runner-manager-e2e-systemd}")
HIERS=$(cat "$STATE/hierarchies" 2>/dev/null || echo "systemd unified memory cpu cpuacct pids blkio devices")

ours() {
  local p=$1
  [ -n "$p" ] && [ -r "/proc/$p/cmdline" ] || return 1
  tr '\0' ' ' < "/proc/$p/cmdline" | grep -q '^/lib/systemd/systemd --system --unit=rm-e2e.target' || return 1
  [ "$(readlink "/proc/$p/ns/pid")" != "$(readlink /proc/self/ns/pid)" ] || return 1
  awk '/^NSpid:/ { exit !($NF == 1) }' "/proc/$p/status"
}

PID=$(cat "$STATE/pid" 2>/dev/null || true)
if ours "$PID"; then
  # Manager.Exit: systemd-shutdown TERMs, then KILLs, every process of the namespace.
  timeout 20 nsenter --target "$PID" --mount --uts --pid --cgroup -- systemctl --force exit >/dev/null 2>&1 || true
  for _ in $(seq 150); do ours "$PID" || break; sleep 0.1; done
  if ours "$PID"; then
    echo "systemd/stop.sh: systemd did not exit; SIGKILL to the namespace's init $PID" >&2
    kill -KILL "$PID"
    for _ in $(seq 100); do ours "$PID" || break; sleep 0.1; done
  fi
fi
UNSHARE=$(cat "$STATE/unshare.pid" 2>/dev/null || true)
if [ -n "$UNSHARE" ] && tr '\0' ' ' < "/proc/$UNSHARE/cmdline" 2>/dev/null | grep -q "^unshare .*$STATE/inner.sh"; then
  running() { [ -r "/proc/$UNSHARE/stat" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$UNSHARE/stat"; }
  for _ in $(seq 50); do running || break; sleep 0.1; done
fi
for h in $HIERS; do
  root="/sys/fs/cgroup/$h/$CG"
  [ -d "$root" ] || continue
  for _ in $(seq 50); do
    find "$root" -depth -type d -exec rmdir {} \; 2>/dev/null
    [ -d "$root" ] || break
    sleep 0.1
  done
  [ -d "$root" ] && echo "systemd/stop.sh: could not remove $root" >&2
done
# The global sysctls PID 1 raised when /proc/sys was left writable (start.sh saved them).
if [ -f "$STATE/sysctl.before" ]; then
  while IFS='=' read -r k v; do
    [ "$(sysctl -n "$k" 2>/dev/null)" = "$v" ] || sysctl -qw "$k=$v"
  done < "$STATE/sysctl.before"
fi
# The empty /var/lib/cni a job's Docker engine unit made as its mount point (TemporaryFileSystem=,
# node-agent/src/docker/engine.rs CNI_DIR), when the host had none: removed if still empty.
[ ! -f "$STATE/no-var-lib-cni" ] || rmdir /var/lib/cni 2>/dev/null || true
rm -rf "$STATE"
echo "systemd stopped"
