#!/usr/bin/env bash
# Builds the two images of this repository without a registry or a Docker engine, as a user's CI would build them
# from the Dockerfiles, into a cache outside the checkout keyed by what goes into each:
#   base      a Debian bookworm root filesystem with Python 3.11 from Debian's packages (mmdebstrap), made an image
#             by `podman import` (nothing pulled): the PYTHON_IMAGE both Dockerfiles build on
#   operator  Dockerfile                (buildah bud --isolation chroot --pull=never --build-arg PYTHON_IMAGE=base)
#   worker    examples/app/Dockerfile   (the sample service's worker, likewise)
#   pause     the pods' sandbox, Kubernetes' pause.c from the control plane's module (a node needs it)
#   rabbitmq  (`build.sh rabbitmq VERSION` only) the broker from devcluster/rabbitmq's root filesystem of VERSION
# Each image is kept in podman's storage and as an archive (`podman save`) that a node imports into containerd.
# Prints one line per image, `NAME REFERENCE ARCHIVE`, last; a second run costs hashes.
# Needs root (mmdebstrap, buildah's chroot isolation); installs mmdebstrap, podman, buildah and runc with apt when missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache_root=${IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/celery-event-operator/images}
# What the official Debian-based Python images hold that the images need: passwd (useradd), tzdata (kombu reads
# the system's time zones), the CA store.
packages=python3,python3-venv,ca-certificates,passwd,tzdata

say() { printf '==> %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { echo "error: building the images needs root" >&2; exit 1; }
missing=()
# runc: what the image tests run them with (crun, podman's first choice, refuses hybrid cgroup v1 + v2 machines).
for tool in mmdebstrap podman buildah runc; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
flock 9

# The hash of files (paths relative to the repository) with their names, and of this script.
hash_of() { (cd "$repo" && find "$@" -type f ! -path '*/__pycache__/*' ! -path '*.egg-info/*' -print0 | sort -z |
    xargs -0 sha256sum; cat "$here/build.sh") | sha256sum | cut -c1-12; }

# An image in podman's storage from its archive, or the archive from the image: either may be gone alone.
ready() {  # REFERENCE ARCHIVE
    if [ -s "$2" ]; then
        podman image exists "$1" || podman load --quiet --input "$2" >/dev/null
        return 0
    fi
    return 1
}
save() {  # REFERENCE ARCHIVE
    podman save --quiet --format docker-archive --output "$2.partial" "$1"
    mv "$2.partial" "$2"
}

# Each build of an image is ~200-400 MB: the newest three of each name are kept (other checkouts share the cache).
prune() {  # NAME REFERENCE-BEFORE-KEY
    local old key
    for old in $(ls -t "$cache_root/$1"-*.tar 2>/dev/null | tail -n +4); do
        key=${old##*/"$1"-}
        podman rmi --force "$2${key%.tar}" >/dev/null 2>&1 || true
        rm -f "$old"
    done
}

# `build.sh rabbitmq VERSION`: the broker of that version as an image, from the root filesystem the tests run it
# from (devcluster/rabbitmq/build.sh: Debian's rabbitmq-server), for a node to run it as a pod.
if [ "${1:-}" = rabbitmq ]; then
    rootfs=$("$repo/devcluster/rabbitmq/build.sh" "${2:?usage: build.sh rabbitmq VERSION}" | tail -n 1)
    tag=$(basename "$rootfs")-$(sha256sum "$here/build.sh" | cut -c1-6)
    reference=localhost/celery-event-operator/rabbitmq:$tag
    archive=$cache_root/rabbitmq-$tag.tar
    if ! ready "$reference" "$archive"; then
        say "making an image of $rootfs"
        tar -C "$rootfs" --exclude=./proc --exclude=./node -c . |
            podman import --quiet --change 'CMD ["/usr/lib/rabbitmq/bin/rabbitmq-server"]' - "$reference" >/dev/null
        save "$reference" "$archive"
        prune "rabbitmq-${2}-" "localhost/celery-event-operator/rabbitmq:${2}-"
    fi
    touch "$archive"
    echo "rabbitmq $reference $archive"
    exit 0
fi

# The base's recipe is its key: a change elsewhere in this script does not rebuild it.
mmdebstrap_options=(--quiet --variant=apt --include="$packages" --aptopt='Acquire::Check-Valid-Until "false"'
    # Documentation and translations are of no use in an image; apt's lists go with the build.
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin')
base_key=$(printf '%s\n' "${mmdebstrap_options[@]}" | sha256sum | cut -c1-12)
base_ref=localhost/celery-event-operator/python:bookworm-$base_key
base_archive=$cache_root/python-bookworm-$base_key.tar
if ! ready "$base_ref" "$base_archive"; then
    mirror=$(awk '/^URIs:/ && /debian\/?$/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    mirror=${IMAGES_MIRROR:-${mirror:-http://deb.debian.org/debian}}
    say "building the Python base image (Debian bookworm's python3: $packages) into $cache_root (cold: ~1 min)"
    rootfs=$(mktemp --suffix=.tar -p "$cache_root")
    mmdebstrap "${mmdebstrap_options[@]}" bookworm "$rootfs" "$mirror" >&2
    podman import --quiet --change 'CMD ["python3"]' "$rootfs" "$base_ref" >/dev/null
    rm -f "$rootfs"
    save "$base_ref" "$base_archive"
    prune python-bookworm localhost/celery-event-operator/python:bookworm-
fi

build() {  # NAME REPOSITORY DOCKERFILE CONTEXT-FILES...
    local name=$1 repository=$2 dockerfile=$3; shift 3
    local key; key=$(printf '%s\n' "$base_key" | cat - "$repo/$dockerfile" "$repo/.dockerignore" | sha256sum | cut -c1-6)
    key=$key$(hash_of "$@" | cut -c1-6)
    local reference=$repository:$key archive=$cache_root/$name-$key.tar
    if ! ready "$reference" "$archive"; then
        say "building the $name image from $dockerfile (cold: ~1 min; pip installs from the package index)"
        local started=$SECONDS
        # chroot isolation: no container runtime or user namespaces needed; --pull=never: the base is local.
        # This machine's trust store is lent to the build's RUN steps, as a CI runner's own would be (here a proxy
        # signs TLS with a CA of its own), over the base's file of the same path: nothing of it stays in the image.
        # Debian's pip reads that file, and the pip it upgrades to reads the system's store too (truststore).
        local lent=()
        [ ! -s /etc/ssl/certs/ca-certificates.crt ] ||
            lent+=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
        buildah bud --quiet --isolation chroot --pull=never --layers=false --build-arg "PYTHON_IMAGE=$base_ref" \
            "${lent[@]}" -f "$repo/$dockerfile" -t "$reference" "$repo" >&2
        save "$reference" "$archive"
        say "built $reference in $((SECONDS - started)) s ($(du -m "$archive" | cut -f1) MB)"
        prune "$name" "$repository:"
    fi
    touch "$archive"  # the newest used is the last pruned
    echo "$name $reference $archive"
}
# The pause image, every pod's sandbox: Kubernetes' own pause.c (in the k8s.io/kubernetes module the control plane is
# built from, build/pause/), compiled static as its Makefile does, in an image of that one file run as 65535.
kubernetes=$(cd "$repo/devcluster/controlplane" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' k8s.io/kubernetes)
pause_tag=$(awk -F' *[?]= *' '$1 == "TAG" {print $2}' "$kubernetes/build/pause/Makefile")
pause_key=$(cat "$kubernetes/build/pause/linux/pause.c" "$here/build.sh" | sha256sum | cut -c1-12)
pause_ref=localhost/celery-event-operator/pause:$pause_tag-$pause_key
pause_archive=$cache_root/pause-$pause_tag-$pause_key.tar
if ! ready "$pause_ref" "$pause_archive"; then
    command -v gcc >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null; }
    work=$(mktemp -d)
    gcc -Os -Wall -Werror -static -DVERSION="v$pause_tag" -o "$work/pause" "$kubernetes/build/pause/linux/pause.c"
    tar -C "$work" -cf "$work/rootfs.tar" pause
    podman import --quiet --change 'ENTRYPOINT ["/pause"]' --change 'USER 65535:65535' "$work/rootfs.tar" "$pause_ref" >/dev/null
    rm -rf "$work"
    save "$pause_ref" "$pause_archive"
    prune "pause-$pause_tag" "localhost/celery-event-operator/pause:$pause_tag-"
fi
echo "pause $pause_ref $pause_archive"

build operator localhost/celery-event-operator Dockerfile pyproject.toml README.md operator
build worker localhost/billing-worker examples/app/Dockerfile pyproject.toml README.md operator examples/app/billing_app.py
