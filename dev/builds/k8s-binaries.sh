#!/usr/bin/env bash
# Builds the Kubernetes components the tests run on, from the official Go modules, once per version, into
# ~/.cache/epd-operator/k8s/<version>/ (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl;
# with `node` also kubelet and kube-proxy for the real node). Called by dev/builds/k8s_binaries.py, which pins the
# versions and adds etcd and kwok (dev/builds/go_module.py). k8s.io/kubernetes is not consumable as a module (its go.mod points
# the staging modules at ./staging with replace lines a dependent ignores), so a wrapper module
# re-pins each staging module to its published v0.<minor>.<patch> tag (kubernetes issue 79384).
#
# usage: dev/builds/k8s-binaries.sh K8S_VERSION [what]   (what: apiserver-only | all | node; default all)
# Every missing Kubernetes binary is built by one `go build`: the packages they share compile once and
# the links run in parallel.
# Prints the directory holding the binaries on its last line.
set -euo pipefail

K8S_VERSION=${1:?usage: dev/builds/k8s-binaries.sh K8S_VERSION [apiserver-only|all|node] (dev/builds/k8s_binaries.py pins the versions)}
WHAT=${2:-all}
CACHE=${EPD_CACHE:-$HOME/.cache/epd-operator}
OUT="$CACHE/k8s/$K8S_VERSION"
WORK="$CACHE/k8s/build/$K8S_VERSION"
export GOFLAGS=${GOFLAGS:--buildvcs=false} CGO_ENABLED=0

log() { printf '[k8s %s] %s\n' "$K8S_VERSION" "$*" >&2; }
# wait_for PID SECONDS: true once PID has exited, false if it still runs after SECONDS.
wait_for() { local i; for ((i = 0; i < $2; i++)); do kill -0 "$1" 2>/dev/null || return 0; sleep 1; done; ! kill -0 "$1" 2>/dev/null; }

command -v go >/dev/null || { echo "dev/builds/k8s-binaries.sh: Go >= 1.24 is needed to build the Kubernetes control plane (https://go.dev/dl)" >&2; exit 1; }

case "$WHAT" in
  apiserver-only) components=(kube-apiserver) ;;
  all) components=(kube-apiserver kube-controller-manager kube-scheduler kubectl) ;;
  node) components=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy) ;;
  *) echo "unknown target set: $WHAT" >&2; exit 2 ;;
esac

mkdir -p "$OUT" "$WORK"
# One build at a time per cache: a second caller waits, then finds what the first one built.
exec 9>"$CACHE/k8s/.build.lock"
if ! flock -n 9; then log "waiting for another build of this cache to finish"; flock 9; fi
missing=()
for c in "${components[@]}"; do [ -x "$OUT/$c" ] || missing+=("$c"); done

if [ ${#missing[@]} -gt 0 ]; then
  log "building ${missing[*]} from k8s.io/kubernetes@$K8S_VERSION (cold: tens of minutes on 2 cores)"
  gomod=$(cd "$WORK" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  minor=${K8S_VERSION#v1.}
  staging_version="v0.${minor}"
  {
    echo "module epd.local/k8s-wrapper"
    echo
    echo "go 1.24"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    grep -E '^\s*k8s.io/[a-z0-9-]+ => \./staging/src/' "$gomod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
  } > "$WORK/go.mod"
  cat > "$WORK/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubectl/pkg/cmd"
)
GO
  (cd "$WORK" && log "resolving modules" && GOFLAGS="$GOFLAGS -mod=mod" go mod tidy -e >/dev/null 2>"$WORK/tidy.log" || { cat "$WORK/tidy.log" >&2; exit 1; })
  pkgs=()
  for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  tmp="$OUT/.building"
  rm -rf "$tmp" && mkdir -p "$tmp"
  log "go build ${missing[*]}"
  start=$(date +%s)
  (cd "$WORK" && go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" -o "$tmp/" "${pkgs[@]}") &
  builder=$!
  # A cold build takes many minutes of silence: say it is still going.
  while ! wait_for "$builder" 60; do log "  still building ${missing[*]} ($(( $(date +%s) - start )) s)"; done
  wait "$builder"
  for c in "${missing[@]}"; do mv "$tmp/$c" "$OUT/$c"; done
  rmdir "$tmp"
  log "${missing[*]} built in $(( $(date +%s) - start )) s"
fi

log "ready"
echo "$OUT"
