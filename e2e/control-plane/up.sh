#!/usr/bin/env bash
# Everything a fresh machine needs for a local control plane: Debian packages, the API server
# build, kubectl and helm, then start. Prints the KUBECONFIG to use.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/install-packages.sh"
"$here/build-k8s.sh"
"$here/install-tools.sh"
"$here/start.sh"
