#!/usr/bin/env bash
# Builds the real Helm binary from the Go module proxy (helm.sh/helm/v4, pinned in go.mod/go.sum next to this
# script; Helm's module has no replace directives, so its own cmd/helm builds as it is) into a cache outside the
# checkout keyed by those files. Prints the binary's path on its last line; a second run costs a hash.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1 == "helm.sh/helm/v4" {print $2; exit}' "$here/go.mod")
key=$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)
cache_root=${HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/celery-event-operator/helm}
out="$cache_root/$version-$key"
# One build of a version at a time (checkouts share the cache); other versions build meanwhile.
mkdir -p "$cache_root"
exec 9>"$out.lock"
flock 9
if [ ! -x "$out/helm" ]; then
    command -v go >/dev/null || { echo "error: go is needed to build Helm" >&2; exit 1; }
    printf '==> building Helm %s into %s (cold: 4-8 min on 2 cores, ~1 min on a warm build cache)\n' "$version" "$out" >&2
    mkdir -p "$out"
    cd "$here"
    export GOFLAGS="-mod=readonly -trimpath"
    # The version `helm version` prints, as Helm's own release build stamps it.
    nice go build -ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$version" -o "$out/.helm.partial" \
        helm.sh/helm/v4/cmd/helm
    mv "$out/.helm.partial" "$out/helm"
fi
echo "$out/helm"
