#!/usr/bin/env bash
# The e2e suite as CI runs it: a control plane and a real node on this machine (kubelet, kube-proxy, containerd),
# the operator's and the sample worker's images built from the Dockerfiles, RabbitMQ as a pod, the chart installed
# by the real Helm, then `pytest e2e/` (see e2e/README.md). Needs root; no Docker engine, no registry, no kind.
#   e2e/run.sh [PYTEST ARGS]            e.g. e2e/run.sh -k replay
#   e2e/run.sh --rabbitmq 4.0 [ARGS]    with another broker version
set -euo pipefail
cd "$(dirname "$0")/.."
version=()
if [ "${1:-}" = --rabbitmq ]; then version=(--rabbitmq "$2"); shift 2; fi
exec ./dev test "${version[@]}" e2e/ "$@"
