#!/usr/bin/env bash
# Builds kube-apiserver and kube-controller-manager v1.20.2 from Debian bookworm's `kubernetes`
# source package into $RM_K8S_BIN. No registry has API-server binaries, and this is the only
# complete API-server source a reachable registry carries (docs/design.md §9).
# Skips the build when both binaries exist and answer --version; CI starts from an empty cache.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
# Any other release is built from the Go modules, with every component and its etcd.
[ "$RM_K8S_VERSION" = 1.20 ] || exec "$here/../cluster/build.sh" "$@"
OUT=$RM_K8S_BIN
WORK=${K8S_SRC_WORK:-$RM_CACHE/k8s-src}

"$here/install-packages.sh"
# Debian's Go 1.19 (golang-go) builds these v1.20 sources; a newer Go first on PATH does not
# (the vendored tree predates its toolchain checks), so it goes first here.
export PATH="/usr/lib/go-1.19/bin:$PATH"
if [ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/kube-controller-manager" ] \
   && "$OUT/kube-apiserver" --version >/dev/null 2>&1; then
  echo "kube-apiserver already built: $("$OUT/kube-apiserver" --version)"; exit 0
fi
# deb-src entries mirroring the machine's own binary sources, whichever mirror it is configured with.
src=/etc/apt/sources.list.d/debian.sources
if [ -f "$src" ] && ! grep -qs '^Types: deb-src' /etc/apt/sources.list.d/*.sources; then
  sed 's/^Types: deb$/Types: deb-src/' "$src" > /etc/apt/sources.list.d/debian-src.sources
  apt-get update -qq
fi
rm -rf "$WORK"; mkdir -p "$WORK"; cd "$WORK"
apt-get source -qq kubernetes >/dev/null
cd kubernetes-*/
# The vendored modern-go/reflect2 v1.0.1 faults under Go >= 1.18 as soon as a custom resource is
# created ("fatal error: fault ... mapiterinit"); Debian's 1.0.2 sources fix it.
V=vendor/github.com/modern-go/reflect2
G=/usr/share/gocode/src/github.com/modern-go/reflect2
rm -f "$V"/*.go "$V"/*.s
cp "$G"/*.go "$G"/*.s "$V"/
rm -f "$V"/*_test.go
mkdir -p .go/src/k8s.io && ln -sfn ../../.. .go/src/k8s.io/kubernetes
env GOPATH="$PWD/.go" CGO_ENABLED=0 HOME="$WORK" GOFLAGS=-mod=vendor \
  make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log" >&2; exit 1; }
mkdir -p "$OUT"
cp _output/bin/kube-apiserver _output/bin/kube-controller-manager "$OUT"/
cd /; rm -rf "$WORK"
"$OUT/kube-apiserver" --version
