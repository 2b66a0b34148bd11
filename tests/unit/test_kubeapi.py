"""The Kubernetes API's failures by what they mean (the official client's exceptions, no server): an absent object,
a permission the operator lacks (named), the API's passing fault; reads asked again after a blip."""

from __future__ import annotations

from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from celery_event_operator.adapters import kubeapi
from celery_event_operator.core.errors import (
    KubeError,
    KubeForbiddenError,
    KubeUnavailableError,
    NotFoundError,
    OperatorError,
)


def _exception(status: int, retry_after: str | None = None) -> ApiException:
    exc = ApiException(status=status, reason="Reason")
    exc.headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return exc


@pytest.mark.parametrize(
    ("status", "error", "reason"),
    [
        pytest.param(404, NotFoundError, "NotFound", id="404"),
        pytest.param(403, KubeForbiddenError, "KubernetesAPIForbidden", id="403"),
        pytest.param(429, KubeUnavailableError, "KubernetesAPIUnavailable", id="429"),
        pytest.param(500, KubeUnavailableError, "KubernetesAPIUnavailable", id="500"),
        pytest.param(503, KubeUnavailableError, "KubernetesAPIUnavailable", id="503"),
        pytest.param(504, KubeUnavailableError, "KubernetesAPIUnavailable", id="504"),
        pytest.param(409, KubeError, "KubernetesAPIFailed", id="409"),
        pytest.param(422, KubeError, "KubernetesAPIFailed", id="422"),
    ],
)
def test_failures_by_what_they_mean(status: int, error: type[KubeError], reason: str) -> None:
    found = kubeapi.failure(
        _exception(status), "cannot read Secret shop/rabbitmq", "`get` on secrets in namespace shop"
    )
    assert type(found) is error
    assert found.reason == reason
    assert str(found).startswith(f"cannot read Secret shop/rabbitmq: HTTP {status}")
    if status == 403:
        assert "lacks `get` on secrets in namespace shop" in str(found)


def test_retry_after_is_kept() -> None:
    found = kubeapi.failure(_exception(429, "5"), "a", "b")
    assert isinstance(found, KubeUnavailableError)
    assert found.retry_after == 5.0


class _Core:
    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)

    def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> Any:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class _Secret:
    data = {"url": "YW1xcDovL3U6cEBoLw=="}  # amqp://u:p@h/


def _api(*answers: Any) -> kubeapi.KubeApi:
    api = kubeapi.KubeApi.__new__(kubeapi.KubeApi)
    core: Any = _Core(*answers)
    api._core = core
    return api


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        pytest.param(_exception(404), "BrokerSecretInvalid", id="absent"),
        pytest.param(_exception(500), "KubernetesAPIUnavailable", id="500"),
        pytest.param(_exception(429), "KubernetesAPIUnavailable", id="429"),
        pytest.param(
            urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out"), "KubernetesAPIUnavailable", id="timeout"
        ),  # type: ignore[arg-type]
        pytest.param(urllib3.exceptions.ProtocolError("Connection aborted."), "KubernetesAPIUnavailable", id="cut"),
        pytest.param(_exception(403), "KubernetesAPIForbidden", id="403"),
    ],
)
def test_a_secret_is_invalid_only_when_absent(answer: Exception, error: str) -> None:
    with pytest.raises(OperatorError) as raised:
        _api(answer).read_secret_data("shop", "rabbitmq")
    assert raised.value.reason == error


async def test_a_read_is_asked_again_after_a_blip(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr(kubeapi.asyncio, "sleep", sleep)
    kube = kubeapi.AsyncKubeApi(_api(_exception(500), _exception(429, "1"), _Secret()))
    try:
        assert await kube.read(kube.api.read_secret_data, "shop", "rabbitmq") == {"url": "amqp://u:p@h/"}
        assert pauses == [kubeapi.READ_RETRY_PAUSES[0], 1.0]
        # The API asks for a longer wait than a pass may spend: said at once (the next pass asks again).
        kube.api = _api(_exception(429, "5"))
        with pytest.raises(KubeUnavailableError):
            await kube.read(kube.api.read_secret_data, "shop", "rabbitmq")
    finally:
        kube.close()
