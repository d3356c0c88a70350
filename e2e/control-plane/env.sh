# Sourced by the control-plane scripts and the Makefile: where things are cached and run.
# RM_CACHE survives between runs (built binaries, tools); RM_RUN is one control plane's state.
# RM_K8S_VERSION picks the Kubernetes: 1.20 (kube-apiserver and kube-controller-manager built from
# Debian's source package, e2e/control-plane/build-k8s.sh) or a full release such as 1.37.2 (every
# component and etcd built from their Go modules, e2e/cluster/build.sh). The default is the release
# `make test` runs on, so a development control plane started by hand is the server CI tests
# against (a 1.20 one accepted what 1.37 refuses and the other way round).
: "${RM_CACHE:=${XDG_CACHE_HOME:-$HOME/.cache}/runner-manager}"
: "${RM_RUN:=${RM_CACHE}/run}"
: "${RM_K8S_VERSION:=1.37.2}"
: "${RM_ETCD_VERSION:=3.7.3}"
RM_K8S_BIN="$RM_CACHE/k8s-$RM_K8S_VERSION/bin"
RM_TOOLS_BIN="$RM_CACHE/tools/bin"
export RM_CACHE RM_RUN RM_K8S_VERSION RM_ETCD_VERSION RM_K8S_BIN RM_TOOLS_BIN
export PATH="$RM_TOOLS_BIN:$PATH"
