#!/usr/bin/env bash
# `make test`: everything, in the order that fails fastest, with the control plane it starts
# stopped by pid on every exit path. Prints the wall time of each stage.
# RM_K8S_VERSION: the Kubernetes release the suite runs on, 1.37.2 by default (every component
# built from its Go module, e2e/cluster/build.sh), or 1.20 (Debian's source, no node stage).
# RM_TEST_NODE=0 skips the real node stage (a cluster with one node booted by systemd, the
# project's images, `helm install` on it and jobs on runners that are units of the node's
# systemd); `e2e/run-tests.sh --node-only` runs that stage alone.
# Speed on a fresh 2-core machine (issue 27): the Kubernetes build runs in the background at nice
# 19 from the start (the control plane's part first; the tests wait for it alone, the node stage
# for the rest), so it takes the cores the Rust builds leave idle; every Rust target is built in
# one stage before the control plane is awaited; a clone without target/ builds into
# /var/cache/runner-manager/cargo-target (RM_TARGET_CACHE_DIR; RM_TARGET_CACHE=0: no), so a
# later clone on the same machine compiles only the workspace's own crates. The stage table is
# printed at the end of every run, green or not, so a regression shows in every CI log. The real
# node's stage runs in the background from the end of the build stage, beside the tests, the
# benches and the chart stages (RM_NODE_OVERLAP=0: at the end, alone).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export RM_K8S_VERSION=${RM_K8S_VERSION:-1.37.2}
. e2e/control-plane/env.sh
# Its own run directory and ports, so a running `make demo` is left alone.
export RM_RUN="$RM_CACHE/test-run" RM_API_PORT=${RM_TEST_API_PORT:-16543} \
  RM_ETCD_PORT=${RM_TEST_ETCD_PORT:-23890} RM_KCM_PORT=${RM_TEST_KCM_PORT:-10357}

stage() { printf '\n=== %s\n' "$*"; SECONDS_STAGE=$SECONDS; STAGE_OPEN=1; }
STAGE_NAMES=() STAGE_SECS=() STAGE_OPEN=
done_stage() {
  printf -- '--- %s: %ss\n' "$1" $((SECONDS - SECONDS_STAGE))
  STAGE_NAMES+=("$1"); STAGE_SECS+=($((SECONDS - SECONDS_STAGE))); STAGE_OPEN=
  node_failed_early
}
# A node stage in the background that already failed stops the run at the next stage boundary.
node_failed_early() {
  [ -n "${NODE_BG_PID:-}" ] && [ -s "$NODE_BG_DIR/rc" ] && [ "$(cat "$NODE_BG_DIR/rc")" != 0 ] || return 0
  sed 's/^/  node | /' "$NODE_BG_DIR/log"
  echo "the real node's stage (in the background) failed: its log is above" >&2
  exit 1
}
# The table of every stage that ended, and the one that was running when the run stopped.
stage_table() {
  local i
  echo
  echo "stage table ($1 in ${SECONDS}s; Kubernetes build: ${K8S_BUILT:-cached or not awaited})"
  for i in "${!STAGE_NAMES[@]}"; do printf '  %-16s %6ss\n' "${STAGE_NAMES[$i]}" "${STAGE_SECS[$i]}"; done
  [ -z "$STAGE_OPEN" ] || printf '  %-16s %6ss  (stopped here)\n' "(running)" $((SECONDS - SECONDS_STAGE))
  printf '  %-16s %6ss\n' total "$SECONDS"
}
# The real node's cluster: its own run directory, ports, veth, addresses and cgroup, so that a
# cluster started by hand (e2e/cluster/start.sh defaults) is left alone.
export RM_CLUSTER_RUN="$RM_CACHE/test-cluster" RM_CLUSTER_NET=10.213.8 RM_CLUSTER_VETH=rmtest0 \
  RM_CLUSTER_NODE=rm-test-node RM_CLUSTER_CGROUP=runner-manager-e2e-test-node \
  RM_CLUSTER_POD_CIDR=10.98.8.0/24 RM_CLUSTER_SERVICE_CIDR=10.97.8.0/24 RM_CLUSTER_API_PORT=16753 \
  RM_CLUSTER_ETCD_PORT=24000 RM_CLUSTER_KCM_PORT=10467 RM_CLUSTER_SCHED_PORT=10469
# Every Rust target at once (binaries, library and integration tests, benches, examples): one
# feature resolution with the dev-dependencies in, the one nextest, `cargo test` and `cargo bench`
# use, so no stage compiles a crate again. A `cargo build --bins` resolves without them and
# compiled the workspace's crates (and the dependencies whose features differ) a second time.
# --timings: the ten longest compile units are printed after the build stage (slowest_units), so a
# crate that grows slow to build shows in every CI log like a slow test does.
build_all() { cargo build --workspace --all-targets --timings; }
slowest_units() {
  python3 - target/cargo-timings/cargo-timing.html <<'PY' || true
import json, re, sys
m = re.search(r"const UNIT_DATA = (\[.*?\]);\n", open(sys.argv[1]).read(), re.S)
units = json.loads(m.group(1)) if m else []
print(f"slowest of {len(units)} compile units (sum {sum(u['duration'] for u in units):.0f}s):")
for u in sorted(units, key=lambda u: -u["duration"])[:10]:
    print(f"  {u['duration']:7.1f}s  {u['name']} {u.get('target', '').strip()} {u.get('mode', '')}")
PY
}
# Clippy's lints in that same compile (issue 27): `cargo clippy` is `cargo check` with clippy's
# driver as the workspace's rustc wrapper; given to the build instead, one compile of each
# workspace crate lints it and makes its code, and the dependencies are compiled once instead of
# checked once and built again (468 s of a cold run's 1,800 went to that check alone). Exported
# for the whole run: the wrapper is in cargo's fingerprint, so every later cargo (nextest, the
# systemd stage's cargo test, the benches, the node stage) must see it or it compiles again.
# A lint is an error exactly as `cargo clippy --workspace --all-targets -- -D warnings` makes it.
# Called once clippy is installed (the install stage); a node stage run in the background
# inherits the parent's (CLIPPY_ARGS set). A workspace wrapper of the caller's own is replaced:
# it would otherwise silently take the lints' place.
lint_in_build() {
  [ -z "${CLIPPY_ARGS:-}" ] || return 0
  RUSTC_WORKSPACE_WRAPPER=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver || true)
  [ -n "$RUSTC_WORKSPACE_WRAPPER" ] || { echo "run-tests.sh: no clippy-driver (rustup component add clippy)" >&2; exit 1; }
  export RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
}
# The background Kubernetes build (its own process group, killed with the run).
# A node stage run in the background by this script (--node-only) is handed the build's pid and
# status directory, so it waits for the node's part like the parent would.
K8S_BG_PID=${RM_K8S_BG_PID:-} K8S_BG_DIR=${RM_K8S_BG_DIR:-$RM_CACHE/k8s-background}
stop_k8s_bg() { [ -z "$K8S_BG_PID" ] || kill -- -"$K8S_BG_PID" 2>/dev/null || true; }
# The real node's stage, run in the background from the end of the build stage (issue 27): it is
# mostly waiting (the kubelet, jobs, the five-minute operator outage), so it shares the time the
# tests, the benches and the chart stages take; it has its own cluster, ports, cgroup and run
# directories, and reads nothing those stages write. Its log is printed when it is awaited.
NODE_BG_PID= NODE_BG_DIR=$RM_CACHE/node-background
start_node_bg() {
  rm -rf "$NODE_BG_DIR"; mkdir -p "$NODE_BG_DIR"
  RM_K8S_BG_PID=$K8S_BG_PID RM_K8S_BG_DIR=$K8S_BG_DIR setsid bash -c \
    'SECONDS=0; e2e/run-tests.sh --node-only > "$0/log" 2>&1; rc=$?; echo $SECONDS > "$0/seconds"; echo $rc > "$0/rc"' \
    "$NODE_BG_DIR" < /dev/null &
  NODE_BG_PID=$!
  echo "the real node's stage runs in the background from now on (log: $NODE_BG_DIR/log)"
}
# Its process group is stopped and reaped before the cluster is (its own exit trap stops the
# cluster too; stop.sh is idempotent).
stop_node_bg() {
  [ -n "$NODE_BG_PID" ] || return 0
  kill -- -"$NODE_BG_PID" 2>/dev/null || true
  wait "$NODE_BG_PID" 2>/dev/null || true
  NODE_BG_PID=
}
cleanup() {
  local rc=$?
  stop_node_bg
  stop_k8s_bg
  e2e/cluster/stop.sh >/dev/null; e2e/systemd/stop.sh; e2e/control-plane/stop.sh
  if [ "$rc" = 0 ]; then stage_table green; else stage_table "FAILED (exit $rc)"; fi
}
trap cleanup EXIT
# start_k8s_bg: both parts of e2e/cluster/build.sh, then the node's CoreDNS, one after the other,
# in the background; each part's exit status lands in $K8S_BG_DIR/<part>.rc. The control-plane
# part runs at nice 19, in the Rust build's shadow. The node part and CoreDNS start once the
# tests do, and at nice 0: the real node's stage waits for them and is the longer path (a cold
# run's node stage waited 648 s for them at nice 19, starved by the tests, which had 380 s to
# spare).
start_k8s_bg() {
  rm -rf "$K8S_BG_DIR"; mkdir -p "$K8S_BG_DIR"
  setsid bash -c 'for p in control-plane node coredns; do
      if [ $p = control-plane ]; then export RM_K8S_NICE=19; else export RM_K8S_NICE=0; fi
      if [ $p = coredns ]; then e2e/cluster/build-coredns.sh; else e2e/cluster/build.sh $p; fi > "$0/$p.log" 2>&1
      rc=$?; echo $rc > "$0/$p.rc"
      [ $rc = 0 ] || exit $rc
    done' "$K8S_BG_DIR" < /dev/null &
  K8S_BG_PID=$!
}
# wait_k8s PART: waits for that part of the background build (polling its status file: it is
# another process group's child) and fails with its log when it failed.
wait_k8s() {
  local t=$SECONDS
  until [ -s "$K8S_BG_DIR/$1.rc" ]; do
    # Its status file may land between the test above and this one: looked at once more.
    kill -0 "$K8S_BG_PID" 2>/dev/null || [ -s "$K8S_BG_DIR/$1.rc" ] ||
      { echo "the Kubernetes build stopped before its $1 part" >&2; cat "$K8S_BG_DIR"/*.log >&2; return 1; }
    sleep 2
  done
  cat "$K8S_BG_DIR/$1.log"
  [ "$(cat "$K8S_BG_DIR/$1.rc")" = 0 ] || return 1
  [ "$1" = coredns ] || grep -q 'already built' "$K8S_BG_DIR/$1.log" || K8S_BUILT="yes, in the background"
  echo "waited $((SECONDS - t))s for the Kubernetes build's $1 part"
}
# target/: a clone without one builds into the machine's cache (see the header).
# Not under $RM_CACHE: root's home is 0700, and the tests run the built binaries (the entry
# helper, the stand-in listener) as the runner accounts, which must reach them.
if [ ! -e target ] && [ "${RM_TARGET_CACHE:-1}" != 0 ]; then
  cached=${RM_TARGET_CACHE_DIR:-/var/cache/runner-manager/cargo-target}
  # Created traversable (root umask 022 for the parents); an existing parent is never re-moded.
  [ -d "$cached" ] || mkdir -p -m 0755 "$cached"
  # Each clone's own crates add a few GiB beside the shared dependencies: past the cap start over.
  if [ "$(du -s --block-size=1G "$cached" | cut -f1)" -gt "${RM_TARGET_CACHE_GIB:-40}" ]; then
    echo "the cached target directory $cached is over ${RM_TARGET_CACHE_GIB:-40} GiB: emptied"
    rm -rf "${cached:?}"/*
  fi
  rm -rf "$cached/e2e-logs"
  ln -s "$cached" target
fi
# Cargo names a workspace crate's artifacts and fingerprints without the checkout's path, so
# every clone building into the shared directory writes the same ones and judges them fresh by
# its own files' times: a checkout whose files are older than another clone's build would build
# nothing and test that clone's code (it happened: two clones, one edited before the other's
# build). The crates' files are made newer than anything built before this run.
if [ -L target ]; then
  find core crds operator node-agent e2e telemetry -type f -exec touch {} +
fi
# A CI clone is built once: incremental compilation only costs there.
[ "${CI:-}" != true ] || export CARGO_INCREMENTAL=0

node_stage() {
  stage "a real node: images, cluster, pods, helm install, jobs on the node's systemd, runner and placeholder pods (RM_TEST_NODE=0 skips)"
  e2e/cluster/install-packages.sh
  if [ -n "$K8S_BG_PID" ]; then wait_k8s node; wait_k8s coredns; else e2e/cluster/build.sh; fi
  build_all
  e2e/images/build.sh
  # The OpenTelemetry Collector helm-check.sh exports to (issue 33 item 1), from its Go modules
  # (cached by its source's digest; about two minutes cold).
  e2e/otelcol/build.sh >/dev/null
  # The release's packaging (issue 33 item 6): the chart packaged with these images' digests
  # pinned, its index, the manifests rendered from it; helm-check.sh installs that archive, as a
  # team pinning a release would, not the chart's directory.
  RM_RELEASE_PROFILE=debug RM_RELEASE_IMAGES="${RM_IMAGES:-$RM_CACHE/images}" e2e/release.sh "" "$RM_CACHE/release-check"
  e2e/cluster/start.sh
  KUBECONFIG="$RM_CLUSTER_RUN/kubeconfig" e2e/cluster/check.sh
  KUBECONFIG="$RM_CLUSTER_RUN/kubeconfig" RM_CHART="$(ls "$RM_CACHE"/release-check/chart/runner-manager-*.tgz)" \
    e2e/cluster/helm-check.sh
  # Runner pods (execution.mode: Oci) and placeholder pods on the real node (issue 16).
  KUBECONFIG="$RM_CLUSTER_RUN/kubeconfig" e2e/cluster/pods-check.sh
  KUBECONFIG="$RM_CLUSTER_RUN/kubeconfig" e2e/cluster/outage-check.sh
  e2e/cluster/stop.sh
  done_stage node
}
if [ "${1:-}" = --node-only ]; then
  [ "$RM_K8S_VERSION" != 1.20 ] || { echo "run-tests.sh: the node stage needs RM_K8S_VERSION >= 1.37" >&2; exit 2; }
  # Only the node's cluster is started here: leave the suite's control plane and systemd alone.
  trap 'e2e/cluster/stop.sh >/dev/null' EXIT
  e2e/control-plane/install-tools.sh
  RM_DOCKER_CLI=$(e2e/docker/install.sh | tail -n 1)
  export RM_DOCKER_CLI
  lint_in_build
  node_stage
  echo
  echo "make test (node stage only): green in ${SECONDS}s"
  exit 0
fi

stage "install: Debian packages, kubectl, helm, cargo-nextest"
e2e/control-plane/install-tools.sh
[ "$RM_K8S_VERSION" = 1.20 ] || [ "${RM_TEST_NODE:-1}" = 0 ] || e2e/cluster/install-packages.sh
# Docker for jobs' test (systemd stage): rootless Podman and its helpers, a Docker CLI.
RM_DOCKER_CLI=$(e2e/docker/install.sh | tail -n 1)
export RM_DOCKER_CLI
lint_in_build
done_stage install

# Built from the Go modules (every release but 1.20): from now on, beside the Rust stages.
[ "$RM_K8S_VERSION" = 1.20 ] || start_k8s_bg

stage "format (clippy's lints run in the build stage)"
cargo fmt --all -- --check
done_stage format

stage "generated CRDs are fresh (crds/generated and the chart's copy)"
diff -r crds/generated charts/runner-manager/crds
done_stage crds

stage "Argo CD health checks (Lua 5.1 against fixture objects)"
e2e/argocd-health.sh
done_stage argocd-health

stage "build and lint every Rust target: binaries, tests, benches (one dev profile, clippy -D warnings)"
# The scenario tests start the project's binaries as processes: built first, with the test and
# bench binaries, so nothing compiles while the control plane runs.
build_all
slowest_units
cargo nextest run --workspace --no-run
done_stage build

stage "docs: what README.md and docs/ name exists (flags, CRD fields, metrics, reasons, paths, make targets, README figures); no module cycle"
# About a second: the binaries' --help for their flags, the rest is text (the script's header).
python3 e2e/docs-check.py --self-test
python3 e2e/docs-check.py target/debug/runner-manager-operator target/debug/runner-manager-node-agent
# No module of any crate refers to another in a circle (issue 30 item 7): text, under a second.
python3 e2e/module-cycles.py --self-test
python3 e2e/module-cycles.py
done_stage docs

node_wanted() { [ "$RM_K8S_VERSION" != 1.20 ] && [ "${RM_TEST_NODE:-1}" != 0 ]; }
# RM_NODE_OVERLAP=0 runs the node stage at the end instead, alone (the order before issue 27).
if node_wanted && [ "${RM_NODE_OVERLAP:-1}" != 0 ]; then start_node_bg; fi

stage "Kubernetes $RM_K8S_VERSION control plane: built (cached, or waited for) and started"
if [ "$RM_K8S_VERSION" = 1.20 ]; then e2e/control-plane/build-k8s.sh; else wait_k8s control-plane; fi
e2e/control-plane/start.sh
export KUBECONFIG="$RM_RUN/kubeconfig"
done_stage control-plane

stage "unit and integration tests (nextest)"
# The node agent's runner accounts (its installer's job on a real node).
e2e/setup-runner-accounts.sh
slowest() { # the ten slowest tests of the JUnit report nextest's ci profile wrote
  python3 - target/nextest/ci/junit.xml <<'PY' || true
import sys, xml.etree.ElementTree as ET
cases = [(float(c.get("time", 0)), c.get("classname", ""), c.get("name", "")) for c in ET.parse(sys.argv[1]).iter("testcase")]
print(f"slowest of {len(cases)} tests (sum {sum(t for t, _, _ in cases):.0f}s):")
for t, cls, name in sorted(cases, reverse=True)[:10]:
    print(f"  {t:7.1f}s  {cls} {name}")
PY
}
cargo nextest run --workspace --profile ci || { slowest; exit 1; }
slowest
done_stage tests

stage "the systemd launcher and Docker for jobs against a real systemd (PID 1 of its own namespaces)"
# A launcher must run where systemd's pids are its pids: inside, through nsexec. /proc/sys
# writable: a job's engine sets its own network namespace's sysctls (start.sh saves the host's
# values that systemd raises and stop.sh puts them back).
RM_SYSTEMD_PROC_SYS=rw e2e/systemd/start.sh
# --workspace: the same feature set nextest built with, so nothing is compiled again. The
# Docker test after the launcher's, not beside them: its engine's load widened a race in
# `a_runner_that_ends_at_once_was_still_started` (a runner exiting while its start is read;
# seen once, session 21's note).
"${RM_SYSTEMD_STATE:-$RM_CACHE/systemd}/bin/nsexec" env -C "$root" RM_SYSTEMD_TESTS=1 \
  cargo test --workspace --test node_agent -- launch_systemd::
"${RM_SYSTEMD_STATE:-$RM_CACHE/systemd}/bin/nsexec" env -C "$root" RM_SYSTEMD_TESTS=1 \
  RM_DOCKER_CLI="$RM_DOCKER_CLI" cargo test --workspace --test node_agent -- docker_systemd::
e2e/systemd/stop.sh
done_stage systemd

stage "benchmarks, quick mode (dev profile: the figures prove the benches run, not the targets)"
cargo bench --workspace --bench workspace_packages --profile dev -- --quick
cargo bench --workspace --bench scale_up --profile dev -- --quick
cargo bench --workspace --bench operator_scale --profile dev -- --quick
done_stage benches

stage "helm chart: lint, template, install against the control plane"
e2e/chart-check.sh
done_stage chart

stage "helm chart: two releases side by side, upgrade, uninstall"
e2e/chart-releases.sh
done_stage chart-releases

stage "manifests: API schemas (kubeconform, strict; 1.30 and 1.37 plus the CRDs) and best practices (kube-score)"
# kubeconform from its Go module and the schemas from each release's swagger.json (cached): an
# independent check of what `helm template` and deploy/ hold, offline (issue 33 item 7); then
# kube-score (from its Go module too) on the same renders, every finding fixed or waived with
# its reason on the object.
e2e/kubeconform.sh
e2e/kube-score.sh
done_stage manifests

if [ -n "$NODE_BG_PID" ]; then
  stage "a real node (in the background since the build stage): awaited"
  until [ -s "$NODE_BG_DIR/rc" ]; do
    kill -0 "$NODE_BG_PID" 2>/dev/null || [ -s "$NODE_BG_DIR/rc" ] ||
      { cat "$NODE_BG_DIR/log"; echo "the node stage stopped without a status" >&2; exit 1; }
    sleep 2
  done
  wait "$NODE_BG_PID" 2>/dev/null || true; NODE_BG_PID=
  sed 's/^/  node | /' "$NODE_BG_DIR/log"
  node_rc=$(cat "$NODE_BG_DIR/rc")
  STAGE_NAMES+=("node (overlapped)"); STAGE_SECS+=("$(cat "$NODE_BG_DIR/seconds")")
  [ "$node_rc" = 0 ] || { echo "the real node's stage failed (exit $node_rc): its log is above" >&2; exit 1; }
  done_stage node-wait
elif node_wanted; then
  node_stage
fi

echo
echo "make test: all green in ${SECONDS}s"
# (the stage table follows, printed by the exit trap)
