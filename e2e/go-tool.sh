#!/usr/bin/env bash
# e2e/go-tool.sh NAME PACKAGE VERSION: a Go tool built from its module at VERSION into
# $RM_TOOLS_BIN (e2e/kubeconform.sh, e2e/kube-score.sh), unless the binary there already is that
# version. A `go install`ed tool prints "development" for its own version flag, so the module
# version is read from the binary's build information. Prints the binary's path.
# CI reaches the Go module proxy but not GitHub's releases: tools are built, not downloaded.
set -euo pipefail
name=$1 package=$2 version=$3
. "$(cd "$(dirname "$0")" && pwd)/control-plane/env.sh"
bin=$RM_TOOLS_BIN/$name
if [ "$(go version -m "$bin" 2>/dev/null | awk '$1 == "mod" { print $3 }')" != "v$version" ]; then
  mkdir -p "$RM_TOOLS_BIN"
  (cd / && GOBIN="$RM_TOOLS_BIN" go install "$package@v$version") >&2 \
    || { echo "$name: could not build $name v$version from its Go module (is the Go module proxy reachable? go env GOPROXY)" >&2; exit 1; }
fi
echo "$bin"
