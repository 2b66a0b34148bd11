#!/usr/bin/env bash
# The e2e suite against a real cluster: creates a kind cluster, builds and loads the operator image,
# installs RabbitMQ and the chart, runs `pytest -m e2e e2e/`, and deletes the cluster.
# Needs: docker (with a running engine), kind, kubectl, helm. Keep the cluster with KEEP_CLUSTER=1.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${CLUSTER:-celery-event-operator-e2e}
IMAGE=${IMAGE:-celery-event-operator:e2e}
WORKER_IMAGE=${WORKER_IMAGE:-billing-worker:e2e}
for tool in docker kind kubectl helm; do
    command -v "$tool" >/dev/null || { echo "e2e needs $tool on PATH" >&2; exit 2; }
done
docker info >/dev/null 2>&1 || { echo "e2e needs a running Docker engine" >&2; exit 2; }

./dev setup  # the Python environment for pytest
export KUBECONFIG=${KUBECONFIG_E2E:-$PWD/.dev/e2e-kubeconfig}

cleanup() { [ "${KEEP_CLUSTER:-0}" = 1 ] || kind delete cluster --name "$CLUSTER"; }
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 120s
trap cleanup EXIT

docker build -t "$IMAGE" .
docker build -f examples/app/Dockerfile -t "$WORKER_IMAGE" .
kind load docker-image "$IMAGE" "$WORKER_IMAGE" --name "$CLUSTER"

kubectl apply -f e2e/manifests/rabbitmq.yaml
kubectl rollout status deployment/rabbitmq --timeout=300s

helm upgrade --install ceo charts/celery-event-operator --namespace celery-event-operator --create-namespace \
    --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never --wait

E2E_WORKER_IMAGE="$WORKER_IMAGE" .venv/bin/python -m pytest -m e2e e2e/ "$@"
