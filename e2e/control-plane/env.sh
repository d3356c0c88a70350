# Sourced by the control-plane scripts and the Makefile: where things are cached and run.
# RM_CACHE survives between runs (built binaries, tools); RM_RUN is one control plane's state.
: "${RM_CACHE:=${XDG_CACHE_HOME:-$HOME/.cache}/runner-manager}"
: "${RM_RUN:=${RM_CACHE}/run}"
RM_K8S_BIN="$RM_CACHE/k8s-1.20/bin"
RM_TOOLS_BIN="$RM_CACHE/tools/bin"
export RM_CACHE RM_RUN RM_K8S_BIN RM_TOOLS_BIN
export PATH="$RM_TOOLS_BIN:$PATH"
