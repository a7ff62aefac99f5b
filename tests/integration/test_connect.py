"""CONNECT rules, protocol violations, keepalive, TLS on the plain port: each closes only that client."""

from __future__ import annotations

import socket
import ssl
import time

import paho.mqtt.client as mqtt
import pytest

from tests.helpers import Broker, Client, RawClient, cid, connect_packet


@pytest.fixture
def broker(on_file_broker: Broker) -> Broker:
    """One broker for the tests of this file that take the defaults (tests/conftest.py's
    ``file_broker``): each its own client ids and topics, and a log line it waits for is its own
    (``peer``: its socket's address is in the line). Fewer protocol violations than a worker's
    ten warnings a second (connection/ratelimit.py), so none of them is held back."""
    return on_file_broker


def peer(raw: RawClient) -> str:
    """How the broker's log names a raw client's connection: ``(127.0.0.1:PORT)``."""
    host, port = raw.sock.getsockname()[:2]
    return f"({host}:{port})"


def test_unsupported_protocol_level_gets_connack_1_then_close(broker):
    raw = RawClient(broker.port)
    raw.send(connect_packet("v9", level=9))
    assert raw.recv_until_closed() == b"\x20\x02\x00\x01"


def test_wrong_protocol_name_is_refused(broker):
    raw = RawClient(broker.port)
    raw.send(connect_packet("nm", name=b"MQTX"))
    assert raw.recv_until_closed() == b"\x20\x02\x00\x01"


def test_empty_client_id_without_clean_session_is_identifier_rejected(broker):
    raw = RawClient(broker.port)
    raw.send(connect_packet("", clean=False))
    assert raw.recv_until_closed() == b"\x20\x02\x00\x02"


def test_empty_client_id_with_clean_session_is_assigned_one(broker):
    raw = RawClient(broker.port)
    raw.send(connect_packet("", clean=True))
    assert raw.recv_exact(4) == b"\x20\x02\x00\x00"
    raw.close()


def _publish_qos1(topic: bytes, pid: int, payload: bytes) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + pid.to_bytes(2, "big") + payload
    return bytes([0x32, len(body)]) + body


@pytest.mark.parametrize("workers", [1, 2])
def test_packets_pipelined_behind_connect_are_answered_after_the_connack(start_broker, workers):
    """A client need not wait for the CONNACK (MQTT 3.1.4): what it sends behind its CONNECT is
    handled after it, in order, and the CONNACK is the first packet it gets (MQTT-3.2.0-1)."""
    broker = start_broker(workers=workers)
    sub = Client(broker.port, cid("pipe-sub")).connect()
    sub.subscribe("pipe/t", 1)
    raw = RawClient(broker.port)
    raw.send(connect_packet(cid("pipe")) + _publish_qos1(b"pipe/t", 1, b"behind the CONNECT")
             + b"\xc0\x00" + b"\xe0\x00")  # PINGREQ, DISCONNECT: one write, one read
    assert raw.recv_until_closed() == b"\x20\x02\x00\x00" + b"\x40\x02\x00\x01" + b"\xd0\x00"
    assert sub.wait_topic("pipe/t").payload == b"behind the CONNECT"


def test_reserved_connect_flag_closes_the_connection(broker):
    raw = RawClient(broker.port)
    raw.send(connect_packet("rsv", flags=0x03))
    assert raw.recv_until_closed() == b""
    broker.wait_line(peer(raw), "reserved")


def test_second_connect_is_a_protocol_violation(broker):
    raw = RawClient(broker.port)
    name = cid("twice")
    raw.send(connect_packet(name))
    assert raw.recv_exact(4) == b"\x20\x02\x00\x00"
    raw.send(connect_packet(name))
    assert raw.recv_until_closed() == b""
    broker.wait_line(peer(raw), "MQTT-3.1.0-2")


def test_first_packet_must_be_connect(broker):
    raw = RawClient(broker.port)
    raw.send(b"\xc0\x00")  # PINGREQ
    assert raw.recv_until_closed() == b""
    broker.wait_line(peer(raw), "MQTT-3.1.0-1")


def test_malformed_packet_closes_only_that_client(broker):
    good = Client(broker.port, cid("good")).connect()
    good.subscribe("m/#", 1)
    raw = RawClient(broker.port)
    evil = cid("evil")
    raw.send(connect_packet(evil))
    assert raw.recv_exact(4) == b"\x20\x02\x00\x00"
    raw.send(b"\x82\x06\x00\x01\x00\x10ab")  # SUBSCRIBE whose filter length overruns the packet
    assert raw.recv_until_closed() == b""
    pub = Client(broker.port, cid("p")).connect()
    pub.publish("m/ok", b"still fine", qos=1)
    assert good.wait_topic("m/ok").payload == b"still fine"
    broker.wait_line(f"client {evil} {peer(raw)}", "malformed packet")  # the log line names the client


def test_tls_client_hello_on_plain_port_is_named_in_the_log(broker):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        host, port = s.getsockname()[:2]
        try:
            with ctx.wrap_socket(s, server_hostname="localhost"):
                raise AssertionError("TLS handshake should not succeed")
        except (ssl.SSLError, ConnectionResetError, OSError):
            pass
    broker.wait_line(f"{host}:{port}: TLS handshake on a plain MQTT listener")


def test_keepalive_enforced_at_one_and_a_half_times_and_fires_the_will(broker):
    watcher = Client(broker.port, cid("watch")).connect()
    watcher.subscribe("will/ka", 1)
    raw = RawClient(broker.port)
    # CONNECT with keepalive 1 s and a will, then silence.
    cid_b, wt, wm = cid("ka-client").encode(), b"will/ka", b"gone"
    flags = 0x02 | 0x04 | (1 << 3)  # clean, will, will qos 1
    body = (b"\x00\x04MQTT\x04" + bytes([flags]) + (1).to_bytes(2, "big")
            + len(cid_b).to_bytes(2, "big") + cid_b + len(wt).to_bytes(2, "big") + wt
            + len(wm).to_bytes(2, "big") + wm)
    t0 = time.monotonic()  # before the CONNECT: the broker's keepalive clock starts once it has read it
    raw.send(bytes([0x10, len(body)]) + body)
    assert raw.recv_exact(4) == b"\x20\x02\x00\x00"
    raw.recv_until_closed(timeout=10)
    elapsed = time.monotonic() - t0
    assert 1.4 <= elapsed < 4.0, elapsed
    assert watcher.wait_topic("will/ka").payload == b"gone"


def test_max_packet_size_closes_the_connection(start_broker):
    broker = start_broker("--max-packet-size", "1024")
    sub = Client(broker.port, cid("s")).connect()
    sub.subscribe("big/#", 0)
    pub = Client(broker.port, cid("big")).connect()
    pub.c.publish("big/x", b"x" * 2000)
    assert pub.disconnected.wait(10)
    broker.wait_log("exceeds the maximum packet size")
    ok = Client(broker.port, cid("ok")).connect()
    ok.publish("big/y", b"y" * 500, qos=1)
    assert sub.wait_topic("big/y").payload == b"y" * 500
    assert [m.topic for m in sub.messages] == ["big/y"]


def test_mqtt5_client_connects_and_gets_v5_connack(broker):
    c = Client(broker.port, cid("v5"), protocol=mqtt.MQTTv5).connect()
    c.subscribe("v5/t", 1)
    c.publish("v5/t", b"hi", qos=1)
    assert c.wait_topic("v5/t").payload == b"hi"
