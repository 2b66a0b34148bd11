#!/usr/bin/env bash
# Builds the control plane the tests and `./dev cluster up` run: etcd, kube-apiserver, kube-controller-manager and
# kube-scheduler, from the Go modules pinned in go.mod/go.sum next to this script, into a cache outside the
# checkout keyed by those two files and this script. Prints the cache directory on its last line; a second run costs a hash.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$here/go.mod")
key=$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)
cache_root=${CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/celery-event-operator/controlplane}
out="$cache_root/$version-$key"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler)
complete() { for b in "${binaries[@]}"; do [ -x "$out/$b" ] || return 1; done; }
# One build of a version at a time (two checkouts' ./dev setup, or a test run beside a set-up, share the cache);
# other versions build meanwhile.
mkdir -p "$cache_root"
exec 9>"$out.lock"
flock 9
if ! complete; then
    command -v go >/dev/null || { echo "error: go is needed to build the control plane" >&2; exit 1; }
    printf '==> building the Kubernetes %s control plane into %s (cold: ~15 min on 2 cores)\n' "$version" "$out" >&2
    staging="$out.partial"
    rm -rf "$staging"; mkdir -p "$staging"
    cd "$here"
    # -trimpath and a stripped link keep ~330 MB of binaries reproducible and small; nice leaves the
    # machine usable, the build being long and CPU-bound.
    export GOFLAGS="-mod=readonly -trimpath"
    nice go build -ldflags='-s -w' -o "$staging/etcd" go.etcd.io/etcd/server/v3
    # The release's version, as its own build stamps it (/version, kubectl's skew check, the components' logs).
    minor=$(echo "$version" | cut -d. -f2)
    stamp="-X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1"
    stamp="$stamp -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
    for b in kube-apiserver kube-controller-manager kube-scheduler; do
        nice go build -ldflags="-s -w $stamp" -o "$staging/$b" "k8s.io/kubernetes/cmd/$b"
    done
    rm -rf "$out"; mv "$staging" "$out"
fi
echo "$out"
