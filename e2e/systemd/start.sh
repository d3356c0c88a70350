#!/usr/bin/env bash
# A real systemd (Debian's, 252) as PID 1 of its own pid + mount + uts + cgroup namespace, for
# the systemd launcher's tests on a host whose own PID 1 is not systemd (this CI machine, a
# container). Transient units, their limits (v1 controllers on a hybrid host, v2 elsewhere)
# and `systemctl kill/stop` are real; nothing of the host's own units, /run, /tmp, sysctls or
# cgroups is touched. `e2e/systemd/stop.sh` removes every trace.
#
# Then: "$RM_SYSTEMD_STATE/bin/nsexec <cmd>" runs <cmd> inside the namespaces (a launcher must
# run there: MainPID is a pid of systemd's pid namespace); bin/systemd-run and bin/systemctl
# are shortcuts.
#
# Env: RM_SYSTEMD_STATE (default $RM_CACHE/systemd; not under /run, which is private inside),
#      RM_SYSTEMD_CGROUP (default runner-manager-e2e-systemd: systemd's root cgroup in every
#      hierarchy).
# For a Kubernetes node booted by this systemd (e2e/cluster/node-start.sh), the same way kind
# boots one:
#      RM_SYSTEMD_HIERARCHIES  the v1 hierarchies to mount inside on a hybrid host (the kubelet
#                              needs cpuset too; its share of cpus/mems is copied from the parent)
#      RM_SYSTEMD_NETNS=1      a network namespace of its own (the caller wires it)
#      RM_SYSTEMD_PROC_SYS=rw  /proc/sys left writable: PID 1 raises fs.file-max, fs.nr_open
#                              and net.unix.max_dgram_qlen, which are saved here and put back by
#                              stop.sh (a rootless engine's netavark writes the sysctls of its
#                              own network namespace, which a read-only /proc/sys refuses)
#      RM_SYSTEMD_PREINIT      a script sourced inside, in the new mount namespace, just before
#                              systemd starts (private mounts, `mount --make-rshared /`)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../control-plane/env.sh"
STATE=${RM_SYSTEMD_STATE:-$RM_CACHE/systemd}
CG=${RM_SYSTEMD_CGROUP:-runner-manager-e2e-systemd}
case "$STATE" in /run|/run/*) echo "systemd/start.sh: RM_SYSTEMD_STATE must not be under /run" >&2; exit 1 ;; esac
[ "$(id -u)" = 0 ] || { echo "systemd/start.sh: must run as root" >&2; exit 1; }
[ -x /lib/systemd/systemd ] || { echo "systemd/start.sh: the systemd package is missing (e2e/control-plane/install-packages.sh installs it)" >&2; exit 1; }
if [ -s "$STATE/pid" ] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null; then
  echo "systemd/start.sh: already running (pid $(cat "$STATE/pid"))" >&2; exit 1
fi

# The hierarchies this host has: hybrid (v1 controllers + named systemd + empty v2 "unified"),
# or a pure v2 host (one cgroup2 mount).
if [ -d /sys/fs/cgroup/unified ]; then
  HIERS=${RM_SYSTEMD_HIERARCHIES:-"systemd unified memory cpu cpuacct pids blkio devices"}
else
  HIERS="."
fi
mkdir -p "$STATE/units" "$STATE/empty" "$STATE/bin"
echo "$HIERS" > "$STATE/hierarchies"
echo "$CG" > "$STATE/cgroup"
# A job's Docker engine unit makes /var/lib/cni as a mount point when the host has none:
# stop.sh removes it then (if still empty).
[ -e /var/lib/cni ] || : > "$STATE/no-var-lib-cni"
: > "$STATE/systemd.log"

# A private unit path: the host's units (tmpfiles --remove on the shared /tmp, sysctl, the
# host's services) must not start. Transient services need these targets to exist.
unit() { printf '%s\n' "${@:2}" > "$STATE/units/$1"; }
unit rm-e2e.target  '[Unit]' 'Description=runner-manager e2e: default target' 'AllowIsolate=yes'
for t in sysinit basic sockets timers paths slices; do
  unit "$t.target" '[Unit]' "Description=runner-manager e2e: empty $t.target"
done
unit shutdown.target '[Unit]' 'Description=shutdown.target' 'DefaultDependencies=no' 'RefuseManualStart=yes'

for h in $HIERS; do
  [ -d "/sys/fs/cgroup/$h" ] || { echo "systemd/start.sh: /sys/fs/cgroup/$h missing" >&2; exit 1; }
  mkdir -p "/sys/fs/cgroup/$h/$CG"
  # A v1 cpuset cgroup takes no task before it has cpus and mems.
  if [ "$h" = cpuset ]; then
    for f in cpuset.cpus cpuset.mems; do
      [ -n "$(cat "/sys/fs/cgroup/cpuset/$CG/$f")" ] || cat "/sys/fs/cgroup/cpuset/$f" > "/sys/fs/cgroup/cpuset/$CG/$f"
    done
  fi
done
PROC_SYS_RO='mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys'
if [ "${RM_SYSTEMD_PROC_SYS:-ro}" = rw ]; then
  PROC_SYS_RO=': /proc/sys left writable: RM_SYSTEMD_PROC_SYS=rw'
  for k in fs.file-max fs.nr_open net.unix.max_dgram_qlen; do
    v=$(sysctl -n "$k" 2>/dev/null) && echo "$k=$v"
  done > "$STATE/sysctl.before"
fi
PREINIT=:
if [ -n "${RM_SYSTEMD_PREINIT:-}" ]; then cp "$RM_SYSTEMD_PREINIT" "$STATE/preinit.sh"; PREINIT=". $STATE/preinit.sh"; fi
NETNS=; [ "${RM_SYSTEMD_NETNS:-}" = 1 ] && NETNS=--net

cat > "$STATE/inner.sh" <<INNER
#!/bin/bash
set -eu
if [ "\${1:-}" != stage2 ]; then
  # PID 1 of the new pid namespace joins $CG everywhere, then a cgroup namespace makes $CG
  # systemd's "/": at start systemd moves every process of its root cgroup into init.scope,
  # which must not be the host's.
  for h in $HIERS; do echo 0 > /sys/fs/cgroup/\$h/$CG/cgroup.procs; done
  exec unshare --cgroup -- /bin/bash "\$0" stage2
fi
# A private /sys/fs/cgroup (systemd remounts it read-only: a shared one would be the host's).
if [ "$HIERS" = "." ]; then
  mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /sys/fs/cgroup
else
  mount -t tmpfs -o mode=755,nosuid,nodev,noexec cgroup-root /sys/fs/cgroup
  for h in $HIERS; do
    mkdir /sys/fs/cgroup/\$h
    case \$h in
      unified) mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /sys/fs/cgroup/unified ;;
      systemd) mount -t cgroup -o nosuid,nodev,noexec,none,name=systemd cgroup /sys/fs/cgroup/systemd ;;
      *)       mount -t cgroup -o nosuid,nodev,noexec,\$h cgroup /sys/fs/cgroup/\$h ;;
    esac
  done
fi
# Host-wide knobs read-only (PID 1 would raise fs.file-max and fs.nr_open).
$PROC_SYS_RO
mount -o remount,bind,ro /sys
# Logging to a file: "kmsg" on a plain file (the console target needs a tty and is silent).
mount --bind "$STATE/systemd.log" /dev/kmsg
mount --bind /dev/null /dev/console
# A private /run, so the host never looks booted with systemd.
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run
mkdir -p /run/systemd/system.conf.d /run/lock
ln -s /dev/shm /run/shm
cat > /run/systemd/system.conf.d/10-rm-e2e.conf <<'CONF'
[Manager]
LogTarget=kmsg
ShowStatus=no
RuntimeWatchdogSec=off
RebootWatchdogSec=off
KExecWatchdogSec=off
CtrlAltDelBurstAction=none
DefaultCPUAccounting=yes
DefaultMemoryAccounting=yes
DefaultTasksAccounting=yes
DefaultTimeoutStopSec=10s
CONF
$PREINIT
exec env -i container=other \
  SYSTEMD_UNIT_PATH="$STATE/units:/run/systemd/transient" \
  SYSTEMD_GENERATOR_PATH="$STATE/empty" \
  SYSTEMD_ENVIRONMENT_GENERATOR_PATH="$STATE/empty" \
  /lib/systemd/systemd --system --unit=rm-e2e.target --log-target=kmsg --show-status=0
INNER
chmod +x "$STATE/inner.sh"

setsid unshare --pid --fork --mount-proc --mount --uts $NETNS --propagation private \
  -- /bin/bash "$STATE/inner.sh" </dev/null >"$STATE/unshare.log" 2>&1 &
UNSHARE=$!
echo "$UNSHARE" > "$STATE/unshare.pid"
NSPID=""
for _ in $(seq 200); do
  NSPID=$(awk '{print $1}' "/proc/$UNSHARE/task/$UNSHARE/children" 2>/dev/null) || true
  [ -n "$NSPID" ] && break
  kill -0 "$UNSHARE" 2>/dev/null || break
  sleep 0.05
done
[ -n "$NSPID" ] || { echo "systemd/start.sh: the namespace did not start:" >&2; cat "$STATE/unshare.log" >&2; exit 1; }
echo "$NSPID" > "$STATE/pid"

cat > "$STATE/bin/nsexec" <<NSEXEC
#!/bin/sh
exec nsenter --target "\$(cat $STATE/pid)" --mount --uts --pid --cgroup $NETNS -- "\$@"
NSEXEC
printf '#!/bin/sh\nexec %s/bin/nsexec systemd-run "$@"\n' "$STATE" > "$STATE/bin/systemd-run"
printf '#!/bin/sh\nexec %s/bin/nsexec systemctl "$@"\n' "$STATE" > "$STATE/bin/systemctl"
chmod +x "$STATE/bin/"*

st=""
for _ in $(seq 300); do
  st=$("$STATE/bin/systemctl" is-system-running 2>/dev/null) || true
  case "$st" in running|degraded) break ;; esac
  kill -0 "$NSPID" 2>/dev/null || { echo "systemd/start.sh: systemd exited:" >&2; cat "$STATE/systemd.log" "$STATE/unshare.log" >&2; exit 1; }
  sleep 0.05
done
case "$st" in
  running|degraded) ;;
  *) echo "systemd/start.sh: systemd not ready ($st):" >&2; tail -30 "$STATE/systemd.log" >&2; exit 1 ;;
esac
echo "systemd up: host pid $NSPID ($st); run inside with $STATE/bin/nsexec"
