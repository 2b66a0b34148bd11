#!/usr/bin/env bash
# Builds the root filesystem of one RabbitMQ version the tests run on, from Debian's packages (mmdebstrap), into a
# cache outside the checkout keyed by this script and the version's line in versions.txt. Nothing of the host's
# packages changes. Prints the root filesystem's directory on its last line; a second run costs a hash.
#   devcluster/rabbitmq/build.sh 4.3
# Needs root (a chroot's files belong to its own users) and mmdebstrap (installed with apt when missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
want=${1:?usage: build.sh VERSION (one of: $(awk '!/^#/ && NF {printf "%s ", $1}' "$here/versions.txt"))}
line=$(awk -v v="$want" '$1 == v' "$here/versions.txt")
[ -n "$line" ] || { echo "error: RabbitMQ $want is not in $here/versions.txt" >&2; exit 2; }
read -r _ suite package <<<"$line"
key=$(printf '%s\n' "$line" | cat - "$here/build.sh" | sha256sum | cut -c1-12)
cache_root=${RABBITMQ_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/celery-event-operator/rabbitmq}
out="$cache_root/$want-$suite-$key"
# One build of a version at a time (a test run's nodes, or two checkouts, may ask at once).
mkdir -p "$cache_root"
exec 9>"$out.lock"
flock 9
if [ ! -e "$out/.complete" ]; then
    [ "$(id -u)" = 0 ] || { echo "error: building a RabbitMQ root filesystem needs root" >&2; exit 1; }
    command -v mmdebstrap >/dev/null || {
        echo "==> installing mmdebstrap" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null
    }
    mirror=$(awk '/^URIs:/ && /debian\/?$/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    mirror=${RABBITMQ_MIRROR:-${mirror:-http://deb.debian.org/debian}}
    printf '==> building RabbitMQ %s (%s from Debian %s) into %s (cold: ~30 s)\n' "$want" "$package" "$suite" "$out" >&2
    staging="$out.partial"
    rm -rf "$staging"
    # The mirror is a snapshot: a suite's Release file may be past its Valid-Until date.
    mmdebstrap --quiet --variant=apt --include="rabbitmq-server=$package" \
        --aptopt='Acquire::Check-Valid-Until "false"' "$suite" "$staging" "$mirror" >&2
    # The node resolves its own short host name; a node's files are bind-mounted at /node (rabbitmq.py).
    printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' >"$staging/etc/hosts"
    mkdir -p "$staging/node"
    chroot "$staging" dpkg-query -W -f='${Version}\n' rabbitmq-server >"$staging/.version"
    [ "$(cat "$staging/.version")" = "$package" ] || { echo "error: got rabbitmq-server $(cat "$staging/.version")" >&2; exit 1; }
    touch "$staging/.complete"
    rm -rf "$out"; mv "$staging" "$out"
fi
touch "$out/.complete"  # used now
# Other builds of this version (of an older build script, or left half-built) that no run used for a day go: about
# 240 MB each. One another checkout still uses is built again there.
for other in "$cache_root/$want"-*; do
    case "$other" in "$out"|*.lock) continue ;; esac
    [ -n "$(find "$other" -maxdepth 1 -name .complete -mmin -1440 2>/dev/null)" ] && continue
    ( flock -n 9 || exit 0; rm -rf "$other" ) 9>"${other%.partial}.lock"
done
echo "$out"
