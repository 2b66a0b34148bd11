#!/usr/bin/env bash
# Builds promparse (Prometheus' own text parser, prometheus/common's expfmt, behind a small command: see main.go), from
# the Go modules pinned in go.mod/go.sum next to this script, into a cache outside the checkout keyed by those files,
# main.go and this script, as controlplane/build.sh does. Prints the binary's path on its last line; a second run
# costs a hash.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
key=$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" "$here/build.sh" | sha256sum | cut -c1-12)
cache_root=${PROMPARSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/celery-event-operator/promparse}
out="$cache_root/$key"
if [ ! -x "$out/promparse" ]; then
    command -v go >/dev/null || { echo "error: go is needed to build promparse" >&2; exit 1; }
    printf '==> building promparse (Prometheus text parser) into %s\n' "$out" >&2
    staging="$out.partial"
    rm -rf "$staging"; mkdir -p "$staging"
    cd "$here"
    GOFLAGS="-mod=readonly -trimpath" go build -ldflags='-s -w' -o "$staging/promparse" .
    rm -rf "$out"; mv "$staging" "$out"
fi
echo "$out/promparse"
