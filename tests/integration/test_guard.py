"""The connection layer's limits (connection/guard.py): the unfinished-packet timeout, the
connection rate of a listener, and a client's message rate (reads paused, nothing dropped)."""

from __future__ import annotations

import socket
import time

from tests.helpers import Client, RawClient, connect_packet, wait_for


def _closed(sock: socket.socket, timeout: float) -> bool:
    """Whether the peer closes ``sock`` within ``timeout`` (data that arrives first is skipped)."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if sock.recv(4096) == b"":
                return True
    except TimeoutError:
        return False
    except OSError:
        return True
    return False


def test_a_connection_holding_an_unfinished_packet_is_closed(start_broker):
    broker = start_broker("--packet-timeout", "1")
    raw = RawClient(broker.port)
    raw.send(connect_packet("slow-loris"))
    assert raw.recv_exact(4)[:1] == b"\x20"
    raw.send(b"\x30\x7f\x00\x05sl")  # a PUBLISH of 127 bytes, 4 of them sent
    other = Client(broker.port, "bystander").connect()
    assert _closed(raw.sock, 6), "the connection holding half a packet was not closed"
    other.subscribe("by/t", 0)  # the others are not affected
    broker.wait_log("an unfinished packet held for")


def test_a_listeners_connection_rate_closes_what_is_beyond_it(start_broker):
    broker = start_broker("--max-connection-rate", "5")
    socks = [socket.create_connection(("127.0.0.1", broker.port), timeout=5) for _ in range(30)]
    try:
        closed = sum(_closed(s, 0.5) for s in socks)
        assert closed >= 20, f"only {closed} of 30 connections beyond a rate of 5/s were closed"
    finally:
        for s in socks:
            s.close()
    wait_for(lambda: _connects(broker.port), timeout=10, what="a connection accepted once the rate allows")


def _connects(port: int) -> bool:
    try:
        Client(port, f"later-{time.monotonic_ns()}").connect()
        return True
    except (AssertionError, OSError):
        return False


def test_a_clients_message_rate_pauses_its_reads_and_drops_nothing(start_broker):
    broker = start_broker("--max-client-msg-rate", "50")
    sub = Client(broker.port, "rate-sub").connect()
    sub.subscribe("rate/t", 0)
    pub = Client(broker.port, "rate-pub").connect()
    start = time.monotonic()
    for i in range(200):
        pub.c.publish("rate/t", str(i), qos=0)
    sub.wait_messages(200, timeout=20)
    elapsed = time.monotonic() - start
    assert elapsed >= 2.0, f"200 messages at 50/s took {elapsed:.2f} s"
    assert sorted(int(m.payload) for m in sub.messages) == list(range(200))
