# runner-manager: the two commands of the README, and the pieces they are made of.
# `make test` and `make demo` do all set-up on a fresh machine (Debian packages, the Kubernetes
# build, kubectl and helm, the images) through e2e/control-plane/ and e2e/cluster/; nothing needs
# installing by hand.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo

.PHONY: test demo demo-processes demo-down lint unit crds crds-check control-plane tools release

## test: formatting, lints, unit tests, then the integration tests against a local control
## plane that this target starts and always stops.
test:
	e2e/run-tests.sh

## demo: the product as users run it: a local cluster with a real node (Kubernetes 1.37.2, a
## node booted by systemd), the images, helm install, a policy against the simulated GitHub, a
## handful of jobs run as units of the node's systemd, `kubectl get sp,ra`; leaves it running
## (DEMO_ARGS=--stop stops at the end). DEMO_MODE=processes runs demo-processes instead.
demo:
	e2e/demo.sh $(DEMO_ARGS)

## demo-processes: the loop with the operator and two node agents as local processes (two
## simulated nodes, no kubelet): for multi-node scenarios.
demo-processes:
	e2e/demo-processes.sh $(DEMO_ARGS)

## demo-down: stop what either demo started (the demo cluster, or the processes and their control plane).
demo-down:
	e2e/demo-down.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	env -u KUBECONFIG $(CARGO) nextest run --workspace

## crds: regenerate crds/generated/, the chart's copy and docs/scalepolicy-reference.md after changing an API type.
crds:
	$(CARGO) run -q -p runner-manager-crds --bin crdgen
	cp crds/generated/*.yaml charts/runner-manager/crds/

## crds-check: fail when the committed CRDs differ from what the types generate.
crds-check:
	$(CARGO) run -q -p runner-manager-crds --bin crdgen -- --stdout > /dev/null
	$(CARGO) test -q -p runner-manager-crds --lib committed_crds_are_fresh
	diff -r crds/generated charts/runner-manager/crds

## release: images (OCI archives), the packaged chart with their digests pinned and its index,
## the plain manifests and the CHANGELOG section, for VERSION (default: Cargo.toml's), in
## dist/VERSION (e2e/release.sh says what it checks).
release:
	e2e/release.sh $(VERSION)

control-plane:
	e2e/control-plane/up.sh

tools:
	e2e/control-plane/install-tools.sh
