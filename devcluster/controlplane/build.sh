#!/usr/bin/env bash
# Builds the Kubernetes the tests and `./dev cluster up` run, from the Go modules pinned in go.mod/go.sum next to
# this script, into a cache outside the checkout keyed by those two files and this script:
#   build.sh [controlplane]   etcd, kube-apiserver, kube-controller-manager, kube-scheduler
#   build.sh node             kubelet and kube-proxy (a node of that control plane: same module, same version)
# Prints the cache directory on its last line; a second run costs a hash.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$here/go.mod")
key=$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)
cache_root=${CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/celery-event-operator/controlplane}
out="$cache_root/$version-$key"
case "${1:-controlplane}" in
    controlplane) binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler); cold="~15 min" ;;
    node) binaries=(kubelet kube-proxy); cold="~5 min, ~1 min once the control plane is built" ;;
    *) echo "usage: build.sh [controlplane|node]" >&2; exit 2 ;;
esac
missing() { for b in "${binaries[@]}"; do [ -x "$out/$b" ] || echo "$b"; done; }
# One build of a version at a time (two checkouts' ./dev setup, or a test run beside a set-up, share the cache);
# other versions build meanwhile.
mkdir -p "$cache_root"
exec 9>"$out.lock"
flock 9
if [ -n "$(missing)" ]; then
    command -v go >/dev/null || { echo "error: go is needed to build Kubernetes" >&2; exit 1; }
    printf '==> building Kubernetes %s %s into %s (cold: %s on 2 cores)\n' "$version" "$(missing | xargs)" "$out" "$cold" >&2
    mkdir -p "$out"
    cd "$here"
    # -trimpath and a stripped link keep the binaries reproducible and small; nice leaves the machine usable, the
    # build being long and CPU-bound.
    export GOFLAGS="-mod=readonly -trimpath"
    # The release's version, as its own build stamps it (/version, kubectl's skew check, the components' logs).
    minor=$(echo "$version" | cut -d. -f2)
    stamp="-X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1"
    stamp="$stamp -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
    for b in $(missing); do
        package="k8s.io/kubernetes/cmd/$b"
        [ "$b" != etcd ] || package=go.etcd.io/etcd/server/v3
        nice go build -ldflags="-s -w $stamp" -o "$out/.$b.partial" "$package"
        mv "$out/.$b.partial" "$out/$b"
    done
fi
echo "$out"
