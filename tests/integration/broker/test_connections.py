"""One shared connection per broker: failover lists, backoff after failures, recovery of a stale one."""

from __future__ import annotations

import socket
import urllib.parse

import pytest
from kombu.connection import Connection

from celery_event_operator.broker import urls
from celery_event_operator.broker.connections import Broker, BrokerRegistry, BrokerUnavailableError
from tests.support.operator_process import free_port


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def dead_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"guest:guest@127.0.0.1:{free_port()}"))


def server_properties(connection: Connection) -> str:
    """A round trip to the broker, and what it says it is."""
    channel = connection.channel()
    channel.exchange_declare("amq.direct", "direct", passive=True)
    channel.close()
    return str(connection.connection.server_properties.get("product"))


def test_failover_list_reaches_the_live_broker(test_vhost_url: str) -> None:
    address = urls.parse(f"{dead_url(test_vhost_url)};{test_vhost_url}", failover_strategy="round-robin",
                         vhost_override=None)
    assert Broker(address).run(server_properties) == "RabbitMQ"


def test_failure_backs_off_without_reconnecting_each_time(test_vhost_url: str) -> None:
    clock = FakeClock()
    address = urls.parse(dead_url(test_vhost_url), failover_strategy="round-robin", vhost_override=None)
    broker = Broker(address, clock=clock)
    with pytest.raises(BrokerUnavailableError, match=r"cannot reach the broker at 127\.0\.0\.1"):
        broker.run(server_properties)
    with pytest.raises(BrokerUnavailableError, match="next attempt in 1s"):
        broker.run(server_properties)  # within the backoff: no connection attempt at all
    clock.now += 1.5
    with pytest.raises(BrokerUnavailableError):
        broker.run(server_properties)
    with pytest.raises(BrokerUnavailableError, match="next attempt in 2s"):
        broker.run(server_properties)  # the delay doubled


def test_stale_connection_is_replaced_once(test_vhost_url: str) -> None:
    broker = Broker(urls.parse(test_vhost_url, failover_strategy="round-robin", vhost_override=None))
    first = broker.run(lambda connection: connection.connection)
    first.transport.sock.shutdown(socket.SHUT_RDWR)  # the socket dies under the kept connection
    assert broker.run(server_properties) == "RabbitMQ"
    assert broker.run(lambda connection: connection.connection) is not first


def test_registry_shares_one_broker_per_address(test_vhost_url: str) -> None:
    registry = BrokerRegistry()
    address = urls.parse(test_vhost_url, failover_strategy="round-robin", vhost_override=None)
    same = urls.parse(test_vhost_url, failover_strategy="round-robin", vhost_override=None)
    other = urls.parse(test_vhost_url, failover_strategy="shuffle", vhost_override=None)
    assert registry.get(address) is registry.get(same)
    assert registry.get(address) is not registry.get(other)
    registry.close_all()
