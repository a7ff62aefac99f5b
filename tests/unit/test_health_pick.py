"""Which listener `brokerd health` probes, of several: the fewest layers to get wrong first."""

from __future__ import annotations

from brokerd.cluster.health import pick
from brokerd.cluster.listeners import parse
from brokerd.connection.listener import Listener


def test_plain_before_tls_before_websockets_in_any_order_given():
    listeners = [parse("wss://0.0.0.0:8884/mqtt"), parse("ws://0.0.0.0:8080/mqtt"), parse("mqtts://0.0.0.0:8883")]
    assert pick(listeners).scheme == "mqtts"
    assert pick([*listeners, parse("mqtt://127.0.0.1:1883")]).url == "mqtt://127.0.0.1:1883"
    assert pick(listeners[:2]).scheme == "ws"


def test_a_listener_that_requires_a_client_certificate_comes_last():
    strict = Listener("mqtts", "0.0.0.0", 8883, require_certificate=True)
    assert pick([strict, parse("wss://0.0.0.0:8884/mqtt")]).scheme == "wss"
    assert pick([strict]) is strict
