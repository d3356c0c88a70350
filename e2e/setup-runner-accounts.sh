#!/usr/bin/env bash
# The node agent's runner account pool, as its installer creates it (the Helm chart will do the
# same on nodes): group rm-runners (gid 20000) and accounts rm-runner1..N (uids 20001..), no
# login shell, no home. Idempotent; run as root. Matches the agent's defaults
# `--runner-uid-range 20001-20064 --runner-gid 20000`.
set -euo pipefail
count=${RM_RUNNER_ACCOUNTS:-64}
gid=${RM_RUNNER_GID:-20000}
first_uid=${RM_RUNNER_FIRST_UID:-20001}
if [ "$(id -u)" -ne 0 ]; then
  echo "setup-runner-accounts: needs root (useradd/groupadd)" >&2
  exit 1
fi
getent group rm-runners >/dev/null || groupadd --gid "$gid" rm-runners
for i in $(seq 1 "$count"); do
  name="rm-runner$i"
  uid=$((first_uid + i - 1))
  if ! getent passwd "$name" >/dev/null; then
    useradd --uid "$uid" --gid "$gid" --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin "$name"
  fi
done
echo "setup-runner-accounts: rm-runners ($gid) with rm-runner1..$count (uids $first_uid..$((first_uid + count - 1)))"
