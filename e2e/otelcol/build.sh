#!/usr/bin/env bash
# e2e/otelcol/build.sh: builds the real node's OpenTelemetry Collector (main.go, go.mod) from its
# Go modules, once per source: the binary is cached as $RM_CACHE/otelcol/otelcol-<digest of
# main.go, go.mod and go.sum> and printed. A cold build fetches the modules and takes about two
# minutes on two cores; a cached one nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../control-plane/env.sh"
sum=$(cat "$here/main.go" "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)
out=$RM_CACHE/otelcol/otelcol-$sum
if [ ! -x "$out" ]; then
  mkdir -p "$RM_CACHE/otelcol"
  t=$SECONDS
  # -mod=readonly: go.sum is what was reviewed; a module it does not pin fails the build.
  (cd "$here" && go build -mod=readonly -trimpath -o "$out.tmp" .) >&2 \
    || { echo "otelcol/build.sh: the collector did not build from its Go modules (is the Go module proxy reachable? go env GOPROXY)" >&2; exit 1; }
  mv "$out.tmp" "$out"
  # Older builds of another source go.
  find "$RM_CACHE/otelcol" -maxdepth 1 -name 'otelcol-*' ! -name "otelcol-$sum" -delete
  echo "otelcol/build.sh: built $out in $((SECONDS - t))s" >&2
fi
echo "$out"
