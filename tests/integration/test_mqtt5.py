"""MQTT 5.0 complete (issue #16), against a real `brokerd --workers 2`, written from the OASIS MQTT
Version 5.0 standard (statement ids like [MQTT-3.3.2-7] in the docstrings): topic aliases both ways,
subscription identifiers, message expiry, will delay, the session expiry rules, CONNACK properties,
the client's Maximum Packet Size, flow control, PUBREC error codes, properties passed through
unchanged, No Local across workers, and Mosquitto's MQTT 5 command-line clients.

Where paho hides the bytes, the tests speak MQTT through ``Raw``: a plain socket and a small codec of
the test's own, independent of brokerd's (a bug in brokerd's codec must not hide in its tests). It
lets a test choose the worker a connection lands on before it sends CONNECT (``raw_on``).

Every wait is bounded and waits for an event; a sleep appears only where an interval (message
expiry, will delay) is the thing under test, and those intervals are 1-2 s.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from brokerd.connection.protocol import CONNECT_TIMEOUT_S
from tests.cluster.conftest import client_worker, worker_of
from tests.helpers import WAIT, Broker, Client, cid, free_port, wait_for

V5 = mqtt.MQTTv5

# -- MQTT 5 property identifiers (spec 2.2.2.2) ---------------------------------------------------
PAYLOAD_FORMAT = 0x01
MESSAGE_EXPIRY = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_ID = 0x0B
SESSION_EXPIRY = 0x11
ASSIGNED_CLIENT_ID = 0x12
SERVER_KEEP_ALIVE = 0x13
WILL_DELAY = 0x18
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_AVAILABLE = 0x28
SUBSCRIPTION_IDS_AVAILABLE = 0x29
SHARED_AVAILABLE = 0x2A

_BYTE, _U16, _U32, _VBI, _STR, _BIN, _PAIR = range(7)
_KIND = {
    **dict.fromkeys((0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A), _BYTE),
    **dict.fromkeys((0x13, 0x21, 0x22, 0x23), _U16),
    **dict.fromkeys((0x02, 0x11, 0x18, 0x27), _U32),
    0x0B: _VBI,
    **dict.fromkeys((0x03, 0x08, 0x12, 0x15, 0x1A, 0x1C, 0x1F), _STR),
    **dict.fromkeys((0x09, 0x16), _BIN),
    0x26: _PAIR,
}

# Packet types (spec 2.1.2).
CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, PINGRESP, DISCONNECT = (
    2, 3, 4, 5, 6, 7, 9, 11, 13, 14)

Props = list[tuple[int, Any]]  # in wire order: a property may repeat (User Property, Subscription Id)


# -- a small MQTT codec of the test's own -----------------------------------------------------------

def vbi(n: int) -> bytes:
    """A Variable Byte Integer (spec 1.5.5)."""
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_vbi(data: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def _str(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return len(raw).to_bytes(2, "big") + raw


def props_bytes(props: Props) -> bytes:
    """Properties with their length in front (spec 2.2.2)."""
    out = b""
    for ident, value in props:
        kind = _KIND[ident]
        out += bytes([ident])
        if kind == _BYTE:
            out += bytes([value])
        elif kind == _U16:
            out += value.to_bytes(2, "big")
        elif kind == _U32:
            out += value.to_bytes(4, "big")
        elif kind == _VBI:
            out += vbi(value)
        elif kind in (_STR, _BIN):
            out += _str(value)
        else:
            out += _str(value[0]) + _str(value[1])
    return vbi(len(out)) + out


def parse_props(data: bytes, i: int) -> tuple[Props, int]:
    length, i = _read_vbi(data, i)
    end = i + length
    props: Props = []
    while i < end:
        ident = data[i]
        i += 1
        kind = _KIND[ident]
        if kind == _BYTE:
            value: Any = data[i]
            i += 1
        elif kind == _U16:
            value, i = int.from_bytes(data[i:i + 2], "big"), i + 2
        elif kind == _U32:
            value, i = int.from_bytes(data[i:i + 4], "big"), i + 4
        elif kind == _VBI:
            value, i = _read_vbi(data, i)
        elif kind in (_STR, _BIN):
            n = int.from_bytes(data[i:i + 2], "big")
            value, i = data[i + 2:i + 2 + n], i + 2 + n
            if kind == _STR:
                value = value.decode()
        else:
            n = int.from_bytes(data[i:i + 2], "big")
            key = data[i + 2:i + 2 + n].decode()
            i += 2 + n
            n = int.from_bytes(data[i:i + 2], "big")
            value, i = (key, data[i + 2:i + 2 + n].decode()), i + 2 + n
        props.append((ident, value))
    assert i == end, "property length does not match the properties"
    return props, end


@dataclass
class Pkt:
    """A packet the broker sent, decoded as far as the tests need."""

    kind: int
    flags: int
    body: bytes
    size: int  # the whole packet's size in bytes, fixed header included
    topic: str = ""
    payload: bytes = b""
    pid: int | None = None
    reason: int = 0
    session_present: bool = False
    codes: list[int] = field(default_factory=list)
    props: Props = field(default_factory=list)

    @property
    def qos(self) -> int:
        return (self.flags >> 1) & 3

    @property
    def retain(self) -> bool:
        return bool(self.flags & 1)

    def prop(self, ident: int) -> Any:
        """The property's value (the first, if it repeats), None if absent."""
        return next((v for i, v in self.props if i == ident), None)

    def all(self, ident: int) -> list[Any]:
        return [v for i, v in self.props if i == ident]

    def __repr__(self) -> str:
        names = {CONNACK: "CONNACK", PUBLISH: "PUBLISH", PUBACK: "PUBACK", PUBREC: "PUBREC", PUBREL: "PUBREL",
                 PUBCOMP: "PUBCOMP", SUBACK: "SUBACK", UNSUBACK: "UNSUBACK", PINGRESP: "PINGRESP",
                 DISCONNECT: "DISCONNECT"}
        what = names.get(self.kind, str(self.kind))
        if self.kind == PUBLISH:
            return f"PUBLISH({self.topic!r}, {self.payload[:40]!r}, qos={self.qos}, pid={self.pid}, props={self.props})"
        return f"{what}(pid={self.pid}, reason=0x{self.reason:02x}, codes={self.codes}, props={self.props})"


def decode(first: int, body: bytes, size: int, level: int) -> Pkt:
    p = Pkt(first >> 4, first & 0x0F, body, size)
    v5 = level == 5
    if p.kind == CONNACK:
        p.session_present, p.reason = bool(body[0] & 1), body[1]
        if v5 and len(body) > 2:
            p.props, _ = parse_props(body, 2)
    elif p.kind == PUBLISH:
        n = int.from_bytes(body[:2], "big")
        p.topic = body[2:2 + n].decode()
        i = 2 + n
        if p.qos:
            p.pid, i = int.from_bytes(body[i:i + 2], "big"), i + 2
        if v5:
            p.props, i = parse_props(body, i)
        p.payload = body[i:]
    elif p.kind in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        p.pid = int.from_bytes(body[:2], "big")
        if len(body) > 2:
            p.reason = body[2]
        if len(body) > 3:
            p.props, _ = parse_props(body, 3)
    elif p.kind in (SUBACK, UNSUBACK):
        p.pid = int.from_bytes(body[:2], "big")
        i = 2
        if v5:
            p.props, i = parse_props(body, 2)
        p.codes = list(body[i:])
    elif p.kind == DISCONNECT:
        if body:
            p.reason = body[0]
        if len(body) > 1:
            p.props, _ = parse_props(body, 1)
    return p


def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + vbi(len(body)) + body


def connect_bytes(client_id: str, *, level: int = 5, clean: bool = True, keepalive: int = 60,
                  props: Props = (), will: tuple[str, bytes, int, bool, Props] | None = None,
                  name: bytes | None = None, login: tuple[str, str] | None = None) -> bytes:
    """CONNECT (spec 3.1); ``will``: (topic, payload, qos, retain, will properties); ``login``:
    (user name, password)."""
    flags = (0x02 if clean else 0) | (0xC0 if login is not None else 0)
    payload = _str(client_id)
    if will is not None:
        topic, message, qos, retain, will_props = will
        flags |= 0x04 | (qos << 3) | (0x20 if retain else 0)
        if level == 5:
            payload += props_bytes(will_props)
        payload += _str(topic) + _str(message)
    var = _str(name or (b"MQIsdp" if level == 3 else b"MQTT")) + bytes([level, flags]) + keepalive.to_bytes(2, "big")
    if level == 5:
        var += props_bytes(props)
    if login is not None:
        payload += _str(login[0]) + _str(login[1])
    return packet(0x10, var + payload)


def publish_bytes(topic: str, payload: bytes = b"", qos: int = 0, pid: int | None = None, props: Props = (),
                  retain: bool = False, dup: bool = False, level: int = 5) -> bytes:
    body = _str(topic)
    if qos:
        assert pid is not None
        body += pid.to_bytes(2, "big")
    if level == 5:
        body += props_bytes(props)
    return packet(0x30 | (dup << 3) | (qos << 1) | int(retain), body + payload)


def ack_bytes(kind: int, pid: int, reason: int = 0, level: int = 5) -> bytes:
    """PUBACK, PUBREC, PUBREL or PUBCOMP; the reason code only where MQTT 5 has one to say."""
    first = (kind << 4) | (0x02 if kind == PUBREL else 0)
    body = pid.to_bytes(2, "big")
    if level == 5 and reason:
        body += bytes([reason])
    return packet(first, body)


def subscribe_bytes(pid: int, filters: list[tuple[str, int]], props: Props = (), level: int = 5) -> bytes:
    """SUBSCRIBE; each filter with its options byte (QoS | No Local << 2 | RAP << 3 | RH << 4)."""
    body = pid.to_bytes(2, "big") + (props_bytes(props) if level == 5 else b"")
    for f, options in filters:
        body += _str(f) + bytes([options])
    return packet(0x82, body)


def disconnect_bytes(reason: int = 0, props: Props = ()) -> bytes:
    body = bytes([reason]) + props_bytes(props) if reason or props else b""
    return packet(0xE0, body)


NO_LOCAL = 0x04


class Closed(AssertionError):
    """The broker closed the connection."""


class Raw:
    """One MQTT connection over a plain socket: exact bytes out, decoded packets in."""

    def __init__(self, port: int, host: str = "127.0.0.1", level: int = 5) -> None:
        self.sock = socket.create_connection((host, port), timeout=WAIT)
        self.level = level
        self.buf = b""
        self.worker = 0
        self._pid = 0
        self.held: list[Pkt] = []  # packets read while waiting for something else

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        """Close the socket without DISCONNECT: to the broker, the network failed."""
        self.sock.close()

    def next_pid(self) -> int:
        self._pid = self._pid % 65535 + 1
        return self._pid

    def _take(self) -> Pkt | None:
        buf = self.buf
        if len(buf) < 2:
            return None
        length, shift, i = 0, 0, 1
        while True:
            if i >= len(buf):
                return None
            b = buf[i]
            length |= (b & 0x7F) << shift
            i += 1
            if not b & 0x80:
                break
            shift += 7
        if len(buf) < i + length:
            return None
        self.buf = buf[i + length:]
        return decode(buf[0], buf[i:i + length], i + length, self.level)

    def recv(self, timeout: float = WAIT) -> Pkt:
        """The next packet (one held back first); Closed if the broker closes the connection."""
        if self.held:
            return self.held.pop(0)
        return self._recv_wire(timeout)

    def _recv_wire(self, timeout: float = WAIT) -> Pkt:
        deadline = time.monotonic() + timeout
        while True:
            pkt = self._take()
            if pkt is not None:
                return pkt
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out after {timeout} s waiting for a packet")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                data = b""
            if not data:
                raise Closed("the broker closed the connection")
            self.buf += data

    def expect(self, kind: int, timeout: float = WAIT) -> Pkt:
        pkt = self.recv(timeout)
        assert pkt.kind == kind, f"expected packet type {kind}, got {pkt}"
        return pkt

    def until_closed(self, timeout: float = WAIT) -> list[Pkt]:
        """Every packet until the broker closes the connection (bounded)."""
        got: list[Pkt] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                got.append(self.recv(max(0.01, deadline - time.monotonic())))
            except Closed:
                return got
            except AssertionError:
                raise AssertionError(f"the broker did not close the connection; it sent {got}") from None

    def connect(self, client_id: str, *, expect_rc: int = 0, **kwargs: Any) -> Pkt:
        self.send(connect_bytes(client_id, level=self.level, **kwargs))
        connack = self.expect(CONNACK)
        assert connack.reason == expect_rc, connack
        return connack

    def subscribe(self, filters: list[tuple[str, int]], props: Props = ()) -> Pkt:
        pid = self.next_pid()
        self.send(subscribe_bytes(pid, filters, props, self.level))
        while True:
            pkt = self._recv_wire()
            if pkt.kind == SUBACK and pkt.pid == pid:
                return pkt
            self.held.append(pkt)  # retained messages may come first

    def publish(self, topic: str, payload: bytes, qos: int = 0, props: Props = (), retain: bool = False) -> None:
        """Publish and, for QoS 1/2, complete the exchange (PUBACK, or PUBREC/PUBREL/PUBCOMP)."""
        pid = self.next_pid() if qos else None
        self.send(publish_bytes(topic, payload, qos, pid, props, retain, level=self.level))
        if qos == 1:
            ack = self._ack_for(PUBACK, pid)
            assert ack.reason < 0x80, ack
        elif qos == 2:
            rec = self._ack_for(PUBREC, pid)
            assert rec.reason < 0x80, rec
            self.send(ack_bytes(PUBREL, pid, level=self.level))  # type: ignore[arg-type]
            self._ack_for(PUBCOMP, pid)

    def _ack_for(self, kind: int, pid: int | None) -> Pkt:
        while True:
            pkt = self._recv_wire()
            if pkt.kind == kind and pkt.pid == pid:
                return pkt
            self.held.append(pkt)

    def messages(self, until: Callable[[list[Pkt]], bool], timeout: float = WAIT) -> list[Pkt]:
        """PUBLISH packets, acknowledged as they come, until ``until(all so far)`` holds."""
        got: list[Pkt] = []
        deadline = time.monotonic() + timeout
        while not until(got):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out after {timeout} s; received {got}")
            try:
                pkt = self.recv(left)
            except Closed:
                raise Closed(f"the broker closed the connection; received {got}") from None
            except AssertionError:
                raise AssertionError(f"timed out after {timeout} s; received {got}") from None
            if pkt.kind == PUBLISH:
                got.append(pkt)
                if pkt.qos == 1:
                    self.send(ack_bytes(PUBACK, pkt.pid, level=self.level))  # type: ignore[arg-type]
                elif pkt.qos == 2:
                    self.send(ack_bytes(PUBREC, pkt.pid, level=self.level))  # type: ignore[arg-type]
            elif pkt.kind == PUBREL:
                self.send(ack_bytes(PUBCOMP, pkt.pid, level=self.level))  # type: ignore[arg-type]
            else:
                raise AssertionError(f"unexpected {pkt} while waiting for messages")
        return got

    def until_payload(self, payload: bytes, timeout: float = WAIT) -> list[Pkt]:
        """Messages until one with ``payload`` arrived (a marker published after what is tested)."""
        return self.messages(lambda got: any(m.payload == payload for m in got), timeout)

    def ping(self) -> list[Pkt]:
        """PINGREQ; returns what the broker sent before its PINGRESP (it is still connected)."""
        self.send(b"\xc0\x00")
        before: list[Pkt] = []
        while True:
            pkt = self.recv()
            if pkt.kind == PINGRESP:
                return before
            before.append(pkt)

    def disconnect(self, reason: int = 0, props: Props = ()) -> None:
        self.send(disconnect_bytes(reason, props))
        self.sock.close()


def _worker_of(broker: Broker, sock: socket.socket) -> int:
    port = sock.getsockname()[1]

    def find() -> int:
        try:
            return worker_of(broker, port)
        except AssertionError:
            return 0  # not accepted yet
    return int(wait_for(find, what=f"the worker holding the connection from port {port}"))  # type: ignore[arg-type]


def raw_on(broker: Broker, *, on: int | None = None, off: int | None = None, level: int = 5) -> Raw:
    """A connection (no CONNECT sent yet) on worker ``on``, or on any worker but ``off``.

    Slow: connections until one lands there, each found by a scan of the workers' sockets (seconds
    on a loaded box). A test that times what follows makes it first: timed with the reconnect it
    serves, the search once made that reconnect seem to take 4-8 s."""
    for _ in range(80):
        raw = Raw(broker.port, broker.host, level)
        opened = time.monotonic()
        w = _worker_of(broker, raw.sock)
        # A scan that took half the broker's 10 s for a CONNECT (a loaded box, thousands of sockets
        # to read) leaves the caller too little: the broker closed such a socket before its CONNECT.
        fresh = time.monotonic() - opened < CONNECT_TIMEOUT_S / 2
        if fresh and (on is None or w == on) and (off is None or w != off):
            raw.worker = w
            return raw
        raw.close()
    pytest.fail(f"no connection landed on the wanted worker (on={on}, off={off}) in 80 tries")


def paho_on(broker: Broker, prefix: str, *, on: int | None = None, off: int | None = None,
            **kwargs: Any) -> Client:
    """A connected clean-start paho client on worker ``on``, or on any worker but ``off``."""
    for _ in range(80):
        c = Client(broker.port, cid(prefix), host=broker.host, **kwargs).connect()
        w = client_worker(broker, c)
        if (on is None or w == on) and (off is None or w != off):
            return c
        c.disconnect()
    pytest.fail(f"no client landed on the wanted worker (on={on}, off={off}) in 80 tries")


def uid() -> str:
    return uuid.uuid4().hex[:6]


def v5_props(kind: int, **values: Any) -> Properties:
    props = Properties(kind)
    for name, value in values.items():
        setattr(props, name, value)
    return props


def subscribe_v5(c: Client, topic: str, qos: int = 1, sub_id: int | None = None, no_local: bool = False) -> list[int]:
    """A paho MQTT 5 SUBSCRIBE with options and an optional Subscription Identifier; its SUBACK codes."""
    props = v5_props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=sub_id) if sub_id else None
    result, mid = c.c.subscribe(topic, options=SubscribeOptions(qos=qos, noLocal=no_local), properties=props)
    assert result == mqtt.MQTT_ERR_SUCCESS
    c._wait(lambda: mid in c.subacks, "SUBACK")
    return c.subacks[mid]


def publish_v5(c: Client, topic: str, payload: bytes, qos: int = 1, retain: bool = False,
               **props: Any) -> None:
    info = c.c.publish(topic, payload, qos, retain, properties=v5_props(PacketTypes.PUBLISH, **props) if props else None)
    info.wait_for_publish(WAIT)
    assert info.is_published(), f"publish to {topic} not acknowledged"


def sub_ids(m: mqtt.MQTTMessage) -> list[int]:
    return sorted(getattr(m.properties, "SubscriptionIdentifier", []) or [])


def no_message(c: Client, marker_pub: Client, topic: str) -> None:
    """Nothing but a marker published now reaches ``c`` (earlier messages came before it)."""
    marker = f"marker-{uid()}".encode()
    marker_pub.publish(topic, marker, qos=1)
    c._wait(lambda: any(m.payload == marker for m in c.messages), "the marker")


# -- brokers shared by the tests of this module (each test uses its own client ids and topics) -----

STATS = ("--stats-interval", "0.2")


def shared_broker(xprocess: Any, tmp_path_factory: Any, label: str, *args: str) -> Iterator[Broker]:
    port = free_port()
    argv = ["--workers", "2", "--listen", f"127.0.0.1:{port}", "--node-id", "t",
            "--data-dir", str(tmp_path_factory.mktemp(f"data-{label}")), *args]
    broker = Broker(xprocess, f"brokerd-mqtt5-{label}-{port}", argv, "127.0.0.1", port)
    broker.start()
    yield broker
    info = xprocess.getinfo(broker.name)
    if info.isrunning():
        info.terminate(timeout=15)


@pytest.fixture(scope="module")
def b2(xprocess, tmp_path_factory) -> Iterator[Broker]:
    """Defaults, 2 workers, fast stats snapshots (for the drop counters)."""
    yield from shared_broker(xprocess, tmp_path_factory, "default", *STATS)


@pytest.fixture(scope="module")
def alias_out(xprocess, tmp_path_factory) -> Iterator[Broker]:
    yield from shared_broker(xprocess, tmp_path_factory, "alias-out", "--topic-alias-out", "on")


@pytest.fixture(scope="module")
def capped(xprocess, tmp_path_factory) -> Iterator[Broker]:
    yield from shared_broker(xprocess, tmp_path_factory, "capped", "--max-keepalive", "30",
                             "--max-session-expiry", "100")


def two_workers(broker: Broker) -> tuple[int, int]:
    w = sorted(broker.workers())
    assert len(w) == 2, w
    return w[0], w[1]


def dropped_expired(broker: Broker) -> Callable[[Callable[[int], bool], str], int]:
    """A reader of the node's drop counter for expired messages (``drops.expired`` in the stats
    snapshots, what `brokerd stats`, /metrics and $SYS show): call it with a predicate."""
    from tests.integration.test_stats import Snapshots

    def until(pred: Callable[[int], bool], what: str) -> int:
        snaps = Snapshots(broker, workers=2)
        try:
            got = snaps.until(lambda s: pred(sum(x["drops"]["expired"] for x in s.values())), what)
            return sum(x["drops"]["expired"] for x in got.values())
        finally:
            snaps.close()
    return until


# == 1. Topic aliases, client to server ===========================================================

def test_connack_topic_alias_maximum_is_10_by_default(b2):
    """CONNACK carries Topic Alias Maximum 10 (--max-topic-alias's default) [MQTT-3.2.2-17]."""
    raw = raw_on(b2)
    assert raw.connect(cid("tam")).prop(TOPIC_ALIAS_MAXIMUM) == 10
    raw.disconnect()


@pytest.mark.parametrize("qos", [0, 1])
def test_a_topic_alias_stands_for_its_topic_and_can_be_remapped(b2, qos):
    """PUBLISH "T" + alias 3 sets the mapping, PUBLISH "" + alias 3 uses it, PUBLISH "T2" + alias 3
    remaps it [MQTT-3.3.2-12]; subscribers on both workers (MQTT 5 and 3.1.1) get the real topic and
    never the client's alias (an alias is per connection, spec 3.3.2.3.4)."""
    u = uid()
    wa, wb = two_workers(b2)
    subs = [paho_on(b2, "sa5", on=wa, protocol=V5), paho_on(b2, "sb5", on=wb, protocol=V5),
            paho_on(b2, "sa4", on=wa), paho_on(b2, "sb4", on=wb)]
    for s in subs:
        s.subscribe(f"{u}/#", 1)
    pub = raw_on(b2)
    pub.connect(cid("ap"))
    t1, t2 = f"{u}/a/b", f"{u}/c"
    pub.publish(t1, b"1", qos, [(TOPIC_ALIAS, 3)])
    pub.publish("", b"2", qos, [(TOPIC_ALIAS, 3)])
    pub.publish(t2, b"3", qos, [(TOPIC_ALIAS, 3)])
    pub.publish("", b"4", qos, [(TOPIC_ALIAS, 3)])
    assert pub.ping() == []  # still connected
    for s in subs:
        got = s.wait_messages(4)
        assert [(m.topic, m.payload) for m in got] == [(t1, b"1"), (t1, b"2"), (t2, b"3"), (t2, b"4")]
        if s.protocol == V5:
            assert all(getattr(m.properties, "TopicAlias", None) is None for m in got)


@pytest.mark.parametrize("alias", [0, 11])
def test_topic_alias_0_or_above_the_maximum_is_disconnect_0x94(b2, alias):
    """A Topic Alias of 0 [MQTT-3.3.2-8] or above the Topic Alias Maximum of the CONNACK
    [MQTT-3.3.2-9] is a Protocol Error: DISCONNECT 0x94 Topic Alias invalid (spec 3.3.2.3.4), and
    the message goes nowhere."""
    u = uid()
    watcher = Client(b2.port, cid("w"), protocol=V5).connect()
    watcher.subscribe(f"{u}/#", 1)
    raw = raw_on(b2)
    raw.connect(cid("bad-alias"))
    raw.send(publish_bytes(f"{u}/x", b"no", 1, 1, [(TOPIC_ALIAS, alias)]))
    assert [(p.kind, p.reason) for p in raw.until_closed()] == [(DISCONNECT, 0x94)]
    no_message(watcher, Client(b2.port, cid("m")).connect(), f"{u}/x")
    assert [m.payload for m in watcher.messages if m.payload == b"no"] == []


def test_empty_topic_with_an_alias_never_set_is_a_protocol_error(b2):
    """An empty Topic Name with an alias that has no mapping on this connection: DISCONNECT 0x82
    Protocol Error (as Mosquitto; the standard names no code for this case)."""
    raw = raw_on(b2)
    raw.connect(cid("unmapped"))
    raw.send(publish_bytes("", b"where", 0, None, [(TOPIC_ALIAS, 4)]))
    assert [(p.kind, p.reason) for p in raw.until_closed()] == [(DISCONNECT, 0x82)]


def test_alias_mappings_do_not_carry_over_to_a_new_connection(b2):
    """A mapping set on one connection is unknown on the next of the same client id and persistent
    session [MQTT-3.3.2-7]: using it there is a Protocol Error."""
    u = uid()
    name = cid("carry")
    watcher = Client(b2.port, cid("w"), protocol=V5).connect()
    watcher.subscribe(f"{u}/#", 1)
    first = raw_on(b2)
    first.connect(name, clean=False, props=[(SESSION_EXPIRY, 60)])
    first.publish(f"{u}/t", b"set", 1, [(TOPIC_ALIAS, 2)])
    first.disconnect()
    again = raw_on(b2, on=first.worker)
    assert again.connect(name, clean=False, props=[(SESSION_EXPIRY, 60)]).session_present
    again.send(publish_bytes("", b"stale", 1, 9, [(TOPIC_ALIAS, 2)]))
    assert [(p.kind, p.reason) for p in again.until_closed()] == [(DISCONNECT, 0x82)]
    no_message(watcher, Client(b2.port, cid("m")).connect(), f"{u}/t")
    assert [m.payload for m in watcher.messages][:1] == [b"set"]
    assert b"stale" not in [m.payload for m in watcher.messages]


@pytest.mark.parametrize("maximum", ["0", "3"])
def test_max_topic_alias_option(start_broker, maximum):
    """--max-topic-alias N: CONNACK says N (0: no Topic Alias Maximum, or 0 [MQTT-3.2.2-18]);
    aliases 1..N work [MQTT-3.3.2-12], N+1 is DISCONNECT 0x94."""
    broker = start_broker("--max-topic-alias", maximum, workers=2)
    n = int(maximum)
    u = uid()
    raw = raw_on(broker)
    tam = raw.connect(cid("tam")).prop(TOPIC_ALIAS_MAXIMUM)
    assert tam == n or (n == 0 and tam is None), tam
    if n:
        watcher = Client(broker.port, cid("w"), protocol=V5).connect()
        watcher.subscribe(f"{u}/#", 1)
        for a in range(1, n + 1):
            raw.publish(f"{u}/{a}", b"set", 1, [(TOPIC_ALIAS, a)])
            raw.publish("", b"use", 1, [(TOPIC_ALIAS, a)])
        got = watcher.wait_messages(2 * n)
        assert [m.topic for m in got] == [f"{u}/{a}" for a in range(1, n + 1) for _ in (0, 1)]
    raw.send(publish_bytes(f"{u}/x", b"over", 1, 99, [(TOPIC_ALIAS, n + 1)]))
    assert [(p.kind, p.reason) for p in raw.until_closed()] == [(DISCONNECT, 0x94)]


# == 2. Topic aliases, server to client ===========================================================

def resolve_aliases(msgs: list[Pkt], maximum: int) -> list[str]:
    """The topics a receiver makes of these PUBLISH packets, checking the sender's alias rules:
    no alias 0 or above ``maximum`` [MQTT-3.1.2-26] [MQTT-3.3.2-11], no empty topic without a
    mapping set on this connection (spec 3.3.2.3.4)."""
    mapping: dict[int, str] = {}
    topics = []
    for m in msgs:
        alias = m.prop(TOPIC_ALIAS)
        if alias is not None:
            assert 1 <= alias <= maximum, f"alias {alias} outside 1..{maximum}: {m}"
            if m.topic:
                mapping[alias] = m.topic
            else:
                assert alias in mapping, f"empty topic with alias {alias} never set: {m}"
        else:
            assert m.topic, f"empty topic without an alias: {m}"
        topics.append(m.topic or mapping[alias])
    return topics


def test_topic_alias_out_sends_aliases_within_the_client_maximum(alias_out):
    """--topic-alias-out on: a subscriber that allows 2 aliases gets a topic's first PUBLISH with the
    topic and an alias, later ones with an empty topic and that alias; never an alias above 2
    [MQTT-3.1.2-26], so a third topic comes in full (or re-maps an alias), and every message
    resolves to its real topic."""
    u = uid()
    sub = raw_on(alias_out)
    sub.connect(cid("tao"), props=[(TOPIC_ALIAS_MAXIMUM, 2)])
    sub.subscribe([(f"{u}/#", 1)])
    pub = Client(alias_out.port, cid("p"), protocol=V5).connect()
    sent = [f"{u}/{t}/long/topic/name" for t in "aabbccaab"]
    for i, t in enumerate(sent):
        pub.publish(t, f"{i}", qos=1)
    got = sub.messages(lambda g: len(g) == len(sent))
    assert [m.payload for m in got] == [str(i).encode() for i in range(len(sent))]
    assert resolve_aliases(got, 2) == sent
    first_a, second_a = got[0], got[1]
    assert first_a.topic == sent[0] and first_a.prop(TOPIC_ALIAS) in (1, 2)
    assert second_a.topic == "" and second_a.prop(TOPIC_ALIAS) == first_a.prop(TOPIC_ALIAS)
    assert got[3].topic == "" and got[3].prop(TOPIC_ALIAS) == got[2].prop(TOPIC_ALIAS) != first_a.prop(TOPIC_ALIAS)


@pytest.mark.parametrize("tam", [None, 0])
def test_topic_alias_out_never_aliases_to_a_client_that_allows_none(alias_out, tam):
    """A client that sent no Topic Alias Maximum (or 0) never gets a Topic Alias [MQTT-3.1.2-27]."""
    u = uid()
    sub = raw_on(alias_out)
    sub.connect(cid("noalias"), props=[] if tam is None else [(TOPIC_ALIAS_MAXIMUM, tam)])
    sub.subscribe([(f"{u}/#", 1)])
    pub = Client(alias_out.port, cid("p"), protocol=V5).connect()
    for i in range(4):
        pub.publish(f"{u}/same", f"{i}", qos=1)
    got = sub.messages(lambda g: len(g) == 4)
    assert [(m.topic, m.prop(TOPIC_ALIAS)) for m in got] == [(f"{u}/same", None)] * 4


def test_no_topic_alias_out_without_the_option(b2):
    """Off by default: a subscriber allowing 10 aliases gets every PUBLISH with its full topic."""
    u = uid()
    sub = raw_on(b2)
    sub.connect(cid("noflag"), props=[(TOPIC_ALIAS_MAXIMUM, 10)])
    sub.subscribe([(f"{u}/#", 1)])
    pub = Client(b2.port, cid("p"), protocol=V5).connect()
    for i in range(4):
        pub.publish(f"{u}/same", f"{i}", qos=i % 2)
    got = sub.messages(lambda g: len(g) == 4)
    assert [(m.topic, m.prop(TOPIC_ALIAS)) for m in got] == [(f"{u}/same", None)] * 4


# == 3. Subscription identifiers ==================================================================

def test_connack_says_subscription_identifiers_are_available(b2):
    """Subscription Identifier Available: 1, or absent, which means available (spec 3.2.2.3.12)."""
    raw = raw_on(b2)
    assert raw.connect(cid("sia")).prop(SUBSCRIPTION_IDS_AVAILABLE) in (None, 1)
    raw.disconnect()


@pytest.mark.parametrize("publisher", ["same worker", "other worker"])
def test_overlapping_subscriptions_deliver_one_copy_with_both_identifiers(b2, publisher):
    """Identifier 7 on "s/#", 9 on "s/+" (two SUBSCRIBEs): a message to "s/x" arrives once, with 7
    and 9 in any order [MQTT-3.3.4-3] [MQTT-3.3.4-4]; one to "s/x/y" only matches "s/#": 7 alone."""
    u = uid()
    sub = paho_on(b2, "sid", protocol=V5)
    w = client_worker(b2, sub)
    assert subscribe_v5(sub, f"{u}/s/#", 1, sub_id=7) == [1]
    assert subscribe_v5(sub, f"{u}/s/+", 1, sub_id=9) == [1]
    pub = paho_on(b2, "p", **({"on": w} if publisher == "same worker" else {"off": w}))
    pub.publish(f"{u}/s/x", b"both", qos=1)
    pub.publish(f"{u}/s/x/y", b"one", qos=1)
    got = sub.wait_messages(2)
    pub.publish(f"{u}/s/end", b"end", qos=1)
    sub.wait_topic(f"{u}/s/end")
    assert [m.payload for m in sub.messages] == [b"both", b"one", b"end"]  # one copy each
    assert sub_ids(got[0]) == [7, 9]
    assert sub_ids(got[1]) == [7]


def test_a_subscription_without_identifier_gets_none(b2):
    """Only subscriptions that have an identifier add one [MQTT-3.3.4-4]: "n/#" without and "n/+"
    with 3; "n/x" carries 3 alone, "n/x/y" (only "n/#") none."""
    u = uid()
    sub = Client(b2.port, cid("noid"), protocol=V5).connect()
    subscribe_v5(sub, f"{u}/n/#", 1)
    subscribe_v5(sub, f"{u}/n/+", 1, sub_id=3)
    pub = Client(b2.port, cid("p")).connect()
    pub.publish(f"{u}/n/x", b"x", qos=1)
    pub.publish(f"{u}/n/x/y", b"y", qos=1)
    got = sub.wait_messages(2)
    assert [(m.payload, sub_ids(m)) for m in got] == [(b"x", [3]), (b"y", [])]


def test_subscribing_again_replaces_the_identifier(b2):
    """A SUBSCRIBE to a filter the session has replaces that subscription [MQTT-3.8.4-3], with the
    new identifier; an UNSUBSCRIBEd identifier is not sent any more."""
    u = uid()
    sub = Client(b2.port, cid("resub"), protocol=V5).connect()
    subscribe_v5(sub, f"{u}/r", 1, sub_id=7)
    subscribe_v5(sub, f"{u}/r", 1, sub_id=4)
    pub = Client(b2.port, cid("p")).connect()
    pub.publish(f"{u}/r", b"1", qos=1)
    assert sub_ids(sub.wait_messages(1)[0]) == [4]


@pytest.mark.parametrize("where", ["same worker", "other worker"])
def test_identifiers_kept_by_a_persistent_session(b2, where):
    """Identifiers are part of the session's subscriptions: a persistent session that reconnects on
    the same worker, or is taken over on the other, gets them on the messages queued while it was
    offline and on live ones [MQTT-3.1.2-5]."""
    u = uid()
    name = cid("sidp")
    first = raw_on(b2)
    first.connect(name, clean=False, props=[(SESSION_EXPIRY, 300)])
    assert first.subscribe([(f"{u}/#", 1)], [(SUBSCRIPTION_ID, 42)]).codes == [1]
    first.disconnect()
    pub = Client(b2.port, cid("p")).connect()
    pub.publish(f"{u}/offline", b"queued", qos=1)
    back = raw_on(b2, **({"on": first.worker} if where == "same worker" else {"off": first.worker}))
    assert back.connect(name, clean=False, props=[(SESSION_EXPIRY, 300)]).session_present
    pub.publish(f"{u}/live", b"live", qos=1)
    got = back.until_payload(b"live")
    assert [(m.payload, m.all(SUBSCRIPTION_ID)) for m in got] == [(b"queued", [42]), (b"live", [42])]


def test_identifiers_kept_after_a_broker_restart(start_broker, tmp_path):
    """With the commit log on (the default) and the same --data-dir, a persistent session's
    identifiers survive a restart: on the message caught up from the log and on live ones."""
    broker = start_broker(workers=2, data_dir=str(tmp_path / "data"))
    u = uid()
    name = cid("sidr")
    sub = Client(broker.port, name, protocol=V5, clean=False,
                 properties=v5_props(PacketTypes.CONNECT, SessionExpiryInterval=300)).connect()
    subscribe_v5(sub, f"{u}/#", 1, sub_id=5)
    sub.disconnect()
    pub = Client(broker.port, cid("p")).connect()
    pub.publish(f"{u}/before", b"before", qos=1)
    Client.close_all([pub])
    assert broker.stop() == 0
    broker.start()
    back = raw_on(broker)
    assert back.connect(name, clean=False, props=[(SESSION_EXPIRY, 300)]).session_present
    Client(broker.port, cid("p2")).connect().publish(f"{u}/after", b"after", qos=1)
    got = back.until_payload(b"after")
    assert [(m.payload, m.all(SUBSCRIPTION_ID)) for m in got] == [(b"before", [5]), (b"after", [5])]


def test_retained_message_on_subscribe_carries_the_identifier(b2):
    """The retained messages sent because of a SUBSCRIBE carry its identifier (spec 3.8.2.1.2)."""
    u = uid()
    pub = Client(b2.port, cid("p")).connect()
    pub.publish(f"{u}/ret", b"kept", qos=1, retain=True)
    for w in two_workers(b2):
        sub = paho_on(b2, "rsid", on=w, protocol=V5)
        subscribe_v5(sub, f"{u}/+", 1, sub_id=11)
        m = sub.wait_messages(1)[0]
        assert (m.payload, m.retain, sub_ids(m)) == (b"kept", True, [11])
    pub.publish(f"{u}/ret", b"", qos=1, retain=True)


def test_shared_subscription_carries_the_identifier(b2):
    """A shared subscription's identifier is sent with what the group member gets [MQTT-3.3.4-3]."""
    u = uid()
    members = [paho_on(b2, "shm", on=w, protocol=V5) for w in two_workers(b2)]
    for i, m in enumerate(members):
        subscribe_v5(m, f"$share/g{u}/{u}/t", 1, sub_id=20 + i)
    pub = Client(b2.port, cid("p")).connect()
    for i in range(10):
        pub.publish(f"{u}/t", f"{i}", qos=1)
    wait_for(lambda: sum(len(m.messages) for m in members) >= 10, what="10 shared messages")
    for i, m in enumerate(members):
        assert all(sub_ids(x) == [20 + i] for x in m.messages), [(x.payload, sub_ids(x)) for x in m.messages]


# == 4. Message expiry ============================================================================

def offline_session(broker: Broker, topic: str, prefix: str = "exp") -> tuple[str, int]:
    """A persistent session (expiry 300 s) subscribed to ``topic`` at QoS 1, now offline; its
    client id and the worker holding it."""
    name = cid(prefix)
    raw = raw_on(broker)
    raw.connect(name, clean=False, props=[(SESSION_EXPIRY, 300)])
    assert raw.subscribe([(topic, 1)]).codes == [1]
    raw.disconnect()
    return name, raw.worker


@pytest.mark.parametrize("publisher", ["same worker", "other worker"])
def test_an_expired_message_is_not_delivered_to_an_offline_session(b2, publisher):
    """QoS 1 with Message Expiry Interval 1 to an offline session, reconnect 2 s later: deleted, not
    delivered [MQTT-3.3.2-5] and counted in drops.expired; a message without expiry published with
    it is delivered (it never expires), without an expiry interval."""
    u = uid()
    count = dropped_expired(b2)
    before = count(lambda n: True, "a snapshot")
    name, home = offline_session(b2, f"{u}/t")
    pub = raw_on(b2, **({"on": home} if publisher == "same worker" else {"off": home}))
    pub.connect(cid("p"))
    pub.publish(f"{u}/t", b"short", 1, [(MESSAGE_EXPIRY, 1)])
    pub.publish(f"{u}/t", b"forever", 1)
    time.sleep(2.2)  # the interval under test (1 s), with room for whole-second rounding
    back = raw_on(b2, on=home)
    assert back.connect(name, clean=False, props=[(SESSION_EXPIRY, 300)]).session_present
    got = back.until_payload(b"forever")
    pub.publish(f"{u}/t", b"marker", 1)
    got += back.until_payload(b"marker")
    back.ping()
    assert b"short" not in [m.payload for m in got], got
    assert all(m.prop(MESSAGE_EXPIRY) is None for m in got)
    count(lambda n: n >= before + 1, f"drops.expired above {before}")


def test_the_remaining_expiry_interval_is_sent(b2):
    """Expiry 10 s, reconnect after ~1.2 s: delivered with the interval minus the time it waited in
    the server, so below 10 [MQTT-3.3.2-6]."""
    u = uid()
    name, home = offline_session(b2, f"{u}/t")
    pub = raw_on(b2, off=home)
    pub.connect(cid("p"))
    pub.publish(f"{u}/t", b"ten", 1, [(MESSAGE_EXPIRY, 10)])
    time.sleep(1.2)
    back = raw_on(b2, on=home)
    assert back.connect(name, clean=False, props=[(SESSION_EXPIRY, 300)]).session_present
    [m] = back.messages(lambda g: len(g) == 1)
    assert m.payload == b"ten" and 1 <= m.prop(MESSAGE_EXPIRY) <= 9, m


def test_a_retained_message_expires(b2):
    """A retained message with expiry 1 s is delivered to a subscriber at once (with at most 1 s
    left), and no longer to one subscribing 2 s later, on either worker [MQTT-3.3.2-5]; a retained
    message without expiry still is."""
    u = uid()
    pub = Client(b2.port, cid("p"), protocol=V5).connect()
    publish_v5(pub, f"{u}/short", b"short", 1, retain=True, MessageExpiryInterval=1)
    pub.publish(f"{u}/keep", b"keep", qos=1, retain=True)
    early = Client(b2.port, cid("early"), protocol=V5).connect()
    early.subscribe(f"{u}/+", 1)
    got = {m.payload: m for m in early.wait_messages(2)}
    assert got[b"short"].properties.MessageExpiryInterval <= 1
    time.sleep(2.2)
    for w in two_workers(b2):
        late = paho_on(b2, "late", on=w, protocol=V5)
        late.subscribe(f"{u}/+", 1)
        late.wait_topic(f"{u}/keep")
        no_message(late, pub, f"{u}/m")
        assert [m.payload for m in late.messages if m.retain] == [b"keep"]
    pub.publish(f"{u}/keep", b"", qos=1, retain=True)


def test_expiry_holds_for_a_session_catching_up_from_the_log_after_a_restart(start_broker, tmp_path):
    """An offline session's messages come back from the commit log after a restart: one whose
    expiry passed meanwhile is not delivered [MQTT-3.3.2-5]; one with time left comes with the
    remaining interval [MQTT-3.3.2-6]; one without expiry comes without."""
    broker = start_broker(workers=2, data_dir=str(tmp_path / "data"))
    u = uid()
    name, _ = offline_session(broker, f"{u}/t")
    pub = raw_on(broker)
    pub.connect(cid("p"))
    pub.publish(f"{u}/t", b"short", 1, [(MESSAGE_EXPIRY, 1)])
    pub.publish(f"{u}/t", b"long", 1, [(MESSAGE_EXPIRY, 60)])
    pub.publish(f"{u}/t", b"forever", 1)
    t0 = time.monotonic()
    pub.disconnect()
    assert broker.stop() == 0
    time.sleep(max(0.0, 2.2 - (time.monotonic() - t0)))
    broker.start()
    back = raw_on(broker)
    assert back.connect(name, clean=False, props=[(SESSION_EXPIRY, 300)]).session_present
    got = back.until_payload(b"forever")
    assert [m.payload for m in got] == [b"long", b"forever"], got
    assert got[0].prop(MESSAGE_EXPIRY) < 60 and got[1].prop(MESSAGE_EXPIRY) is None


# == 5. Will delay ================================================================================

def will_watcher(broker: Broker, topic: str) -> Client:
    w = Client(broker.port, cid("ww"), host=broker.host, protocol=V5).connect()
    w.subscribe(topic, 1)
    return w


def dying(broker: Broker, name: str, topic: str, delay: int | None, expiry: int, **where: int) -> Raw:
    """A connected MQTT 5 client with a will on ``topic`` (Will Delay Interval ``delay``) and
    session expiry ``expiry``."""
    raw = raw_on(broker, **where)
    will_props: Props = [] if delay is None else [(WILL_DELAY, delay)]
    raw.connect(name, clean=True, props=[(SESSION_EXPIRY, expiry)] if expiry else [],
                will=(topic, b"gone", 1, False, will_props))
    return raw


def arrives_within(c: Client, lo: float, hi: float, t0: float) -> float:
    """The will is not there before ``lo`` s after ``t0`` and is there by ``hi``; returns when.
    ``t0``: taken before the close, never after it: the broker's delay runs from its own sight of
    the close, and a test thread that ran late after closing counted the delay from too late (a
    will on time measured short of its delay)."""
    with c.cond:
        early = c.cond.wait_for(lambda: bool(c.messages), max(0.0, t0 + lo - time.monotonic()))
    assert not early, f"the will came {time.monotonic() - t0:.2f} s after the close, before {lo} s"
    c.wait_messages(1, timeout=max(0.1, t0 + hi - time.monotonic()))
    return time.monotonic() - t0


def test_will_delay_postpones_the_will(b2):
    """Will Delay Interval 2, session expiry 60, the connection drops: no will within 1 s, the will
    after 2 s [MQTT-3.1.2-8]."""
    u = uid()
    watcher = will_watcher(b2, f"{u}/will")
    raw = dying(b2, cid("wd"), f"{u}/will", 2, 60)
    t0 = time.monotonic()
    raw.close()
    elapsed = arrives_within(watcher, 1.0, 5.0, t0)
    assert elapsed >= 1.9, elapsed
    assert watcher.messages[0].payload == b"gone"


@pytest.mark.parametrize("where", ["same worker", "other worker"])
def test_reconnecting_within_the_will_delay_cancels_the_will(b2, where):
    """A new connection to the session (Clean Start 0) before the Will Delay Interval passed: the
    will is never sent [MQTT-3.1.3-9], also when it lands on the other worker."""
    u = uid()
    name = cid("wr")
    watcher = will_watcher(b2, f"{u}/will")
    raw = dying(b2, name, f"{u}/will", 2, 60)
    back = raw_on(b2, **({"on": raw.worker} if where == "same worker" else {"off": raw.worker}))  # first: the search is no part of what is timed
    t0 = time.monotonic()
    raw.close()
    assert back.connect(name, clean=False, props=[(SESSION_EXPIRY, 60)]).session_present
    assert time.monotonic() - t0 < 1.5, "the reconnect took too long to prove anything"
    time.sleep(max(0.0, t0 + 3.0 - time.monotonic()))  # past the 2 s delay
    no_message(watcher, Client(b2.port, cid("m")).connect(), f"{u}/will")
    assert b"gone" not in [m.payload for m in watcher.messages]
    back.disconnect()


@pytest.mark.parametrize("old", ["closed", "still open"])
@pytest.mark.parametrize("where", ["same worker", "other worker"])
def test_a_clean_start_reconnect_within_the_will_delay_sends_the_will(b2, where, old):
    """A Clean Start 1 reconnect ends the old session, and the will is sent when the session ends
    (spec 3.1.3.2.2 and its non-normative comment) [MQTT-3.1.2-4]: not held until the delay,
    not cancelled; whether the old connection is gone already or is taken over by the new one,
    on its worker or the other."""
    u = uid()
    name = cid("wc")
    watcher = will_watcher(b2, f"{u}/will")
    raw = dying(b2, name, f"{u}/will", 10, 60)
    back = raw_on(b2, **({"on": raw.worker} if where == "same worker" else {"off": raw.worker}))  # first: the search is no part of what is timed
    if old == "closed":
        raw.close()
    t0 = time.monotonic()
    assert not back.connect(name, clean=True).session_present
    watcher.wait_messages(1, timeout=8)
    assert time.monotonic() - t0 < 9.0, "the will held for its 10 s delay"  # (a loaded box: seconds, not 10)
    assert [m.payload for m in watcher.messages] == [b"gone"]
    back.disconnect()
    raw.close()


@pytest.mark.parametrize("where", ["same worker", "other worker"])
def test_a_resuming_takeover_of_a_live_connection_never_sends_its_delayed_will(b2, where):
    """The old connection is still open when a Clean Start 0 CONNECT takes its session over: the
    old connection closes (0x8E) but its delayed will waits with the session, which is resumed,
    so it is never sent [MQTT-3.1.3-9]."""
    u = uid()
    name = cid("wt")
    watcher = will_watcher(b2, f"{u}/will")
    raw = dying(b2, name, f"{u}/will", 2, 60)
    back = raw_on(b2, **({"on": raw.worker} if where == "same worker" else {"off": raw.worker}))  # first: the search is no part of what is timed
    t0 = time.monotonic()
    assert back.connect(name, clean=False, props=[(SESSION_EXPIRY, 60)]).session_present
    assert time.monotonic() - t0 < 1.5, "the takeover took too long to prove anything"
    time.sleep(max(0.0, t0 + 3.0 - time.monotonic()))  # past the 2 s delay
    no_message(watcher, Client(b2.port, cid("m")).connect(), f"{u}/will")
    assert b"gone" not in [m.payload for m in watcher.messages]
    back.disconnect()
    raw.close()


def test_the_will_is_sent_when_the_session_ends_before_the_delay(b2):
    """Will delay 10 s, session expiry 1 s: the session ends first and the will goes then, at ~1 s
    [MQTT-3.1.2-8]."""
    u = uid()
    watcher = will_watcher(b2, f"{u}/will")
    raw = dying(b2, cid("we"), f"{u}/will", 10, 1)
    t0 = time.monotonic()
    raw.close()
    elapsed = arrives_within(watcher, 0.5, 8.0, t0)  # 8: well before its 10 s delay, on a loaded box too
    assert elapsed >= 0.9, elapsed


def test_will_delay_with_session_expiry_0_sends_the_will_at_once(b2):
    """Session expiry 0: the session ends with the connection, so the delayed will goes at once."""
    u = uid()
    watcher = will_watcher(b2, f"{u}/will")
    raw = dying(b2, cid("w0"), f"{u}/will", 5, 0)
    t0 = time.monotonic()
    raw.close()
    watcher.wait_messages(1, timeout=4)
    assert time.monotonic() - t0 < 4.5, "the will held for its 5 s delay"  # (a loaded box: seconds, not 5)


def test_disconnect_with_will_message_respects_the_will_delay(b2):
    """DISCONNECT 0x04 (Disconnect with Will Message) publishes the will, after its delay too."""
    u = uid()
    watcher = will_watcher(b2, f"{u}/will")
    raw = dying(b2, cid("w4"), f"{u}/will", 2, 60)
    t0 = time.monotonic()
    raw.disconnect(0x04)
    elapsed = arrives_within(watcher, 1.0, 5.0, t0)
    assert elapsed >= 1.9, elapsed


# == 6. Session expiry rules and CONNACK properties ===============================================

def test_disconnect_with_session_expiry_after_connect_with_0_is_a_protocol_error(b2):
    """CONNECT without session expiry, then DISCONNECT with Session Expiry Interval 30: a Protocol
    Error (spec 3.14.2.2.2): the broker sends DISCONNECT 0x82 and closes; as the DISCONNECT is not
    valid, the will is published [MQTT-3.1.2-8] and no session is kept."""
    u = uid()
    name = cid("sx")
    watcher = will_watcher(b2, f"{u}/will")
    raw = dying(b2, name, f"{u}/will", None, 0)
    raw.subscribe([(f"{u}/t", 1)])
    raw.send(disconnect_bytes(0, [(SESSION_EXPIRY, 30)]))
    assert [(p.kind, p.reason) for p in raw.until_closed()] == [(DISCONNECT, 0x82)]
    watcher.wait_messages(1)
    again = raw_on(b2)
    assert not again.connect(name, clean=False, props=[(SESSION_EXPIRY, 30)]).session_present
    again.disconnect(0, [(SESSION_EXPIRY, 0)])


def test_disconnect_with_session_expiry_0_ends_the_session(b2):
    """CONNECT with expiry 30: a plain DISCONNECT keeps the session [MQTT-3.1.2-23]; DISCONNECT with
    Session Expiry Interval 0 ends it (session present 0 on reconnect) [MQTT-3.2.2-3]."""
    name = cid("s0")
    raw = raw_on(b2)
    raw.connect(name, clean=False, props=[(SESSION_EXPIRY, 30)])
    raw.subscribe([("s0/t", 1)])
    raw.disconnect()
    again = raw_on(b2)
    assert again.connect(name, clean=False, props=[(SESSION_EXPIRY, 30)]).session_present
    again.disconnect(0, [(SESSION_EXPIRY, 0)])
    last = raw_on(b2)
    assert not last.connect(name, clean=False, props=[(SESSION_EXPIRY, 30)]).session_present
    last.disconnect(0, [(SESSION_EXPIRY, 0)])


def test_connect_with_session_expiry_0_keeps_no_session(b2):
    """Clean Start 0 but no Session Expiry Interval (0): the session ends with the connection."""
    name = cid("sn")
    raw = raw_on(b2)
    raw.connect(name, clean=False)
    raw.subscribe([("sn/t", 1)])
    raw.disconnect()
    again = raw_on(b2)
    assert not again.connect(name, clean=False).session_present
    again.disconnect()


def test_connack_properties_of_an_mqtt5_client(b2):
    """What CONNACK says to an MQTT 5 client: Receive Maximum, Maximum Packet Size (the
    --max-packet-size default), Topic Alias Maximum 10, Retain/Wildcard/Subscription Identifier/
    Shared Subscription Available 1 or absent (= available), no Maximum QoS (2 is supported), no
    Server Keep Alive for keepalive 60, no Session Expiry Interval when the asked one is granted,
    and no Assigned Client Identifier for a client that gave its own (spec 3.2.2.3)."""
    raw = raw_on(b2)
    ack = raw.connect(cid("props"), props=[(SESSION_EXPIRY, 60)])
    assert 1 <= ack.prop(RECEIVE_MAXIMUM) <= 65535
    assert ack.prop(MAXIMUM_PACKET_SIZE) == 1048576
    assert ack.prop(TOPIC_ALIAS_MAXIMUM) == 10
    for ident in (RETAIN_AVAILABLE, WILDCARD_AVAILABLE, SUBSCRIPTION_IDS_AVAILABLE, SHARED_AVAILABLE):
        assert ack.prop(ident) in (None, 1), (hex(ident), ack)
    for ident in (MAXIMUM_QOS, SERVER_KEEP_ALIVE, SESSION_EXPIRY, ASSIGNED_CLIENT_ID):
        assert ack.prop(ident) is None, (hex(ident), ack)
    idents = [i for i, _ in ack.props]
    assert len(idents) == len(set(idents)), "a property appears twice"
    raw.disconnect(0, [(SESSION_EXPIRY, 0)])


def test_an_empty_client_id_gets_an_assigned_client_identifier(b2):
    """Each empty client id gets its own Assigned Client Identifier in CONNACK [MQTT-3.2.2-16]
    [MQTT-3.1.3-7]; the session then answers to it."""
    ids = []
    for _ in range(2):
        raw = raw_on(b2)
        assigned = raw.connect("").prop(ASSIGNED_CLIENT_ID)
        assert assigned, "no Assigned Client Identifier"
        ids.append(assigned)
        raw.disconnect()
    assert ids[0] != ids[1]


def test_connack_server_keep_alive_and_capped_session_expiry(capped):
    """--max-keepalive 30: keepalive 60 or 0 gets Server Keep Alive 30 [MQTT-3.2.2-21], 20 gets
    none; --max-session-expiry 100: 300 is cut to 100, said in CONNACK (spec 3.2.2.3.2), 50 is not."""
    cases = [(60, 0, 30, None), (0, 0, 30, None), (20, 0, None, None), (20, 300, None, 100), (20, 50, None, None)]
    for keepalive, expiry, server_ka, granted in cases:
        raw = raw_on(capped)
        ack = raw.connect(cid("ka"), keepalive=keepalive, props=[(SESSION_EXPIRY, expiry)] if expiry else [])
        assert (ack.prop(SERVER_KEEP_ALIVE), ack.prop(SESSION_EXPIRY)) == (server_ka, granted), (keepalive, expiry, ack)
        raw.disconnect(0, [(SESSION_EXPIRY, 0)] if expiry else [])


# == 7. Maximum Packet Size from the client =======================================================

def publish_size(topic: str, payload: int, qos: int) -> int:
    """The size of an MQTT 5 PUBLISH without properties."""
    rem = 2 + len(topic.encode()) + (2 if qos else 0) + 1 + payload
    return 1 + len(vbi(rem)) + rem


@pytest.mark.parametrize("qos", [0, 1])
def test_messages_above_the_client_maximum_packet_size_are_not_sent_to_it(b2, qos):
    """A subscriber with Maximum Packet Size 200: a 1000-byte message and one of 201 bytes on the wire
    are not sent to it [MQTT-3.1.2-24]; it stays connected and the next ones (one of exactly 200
    bytes) arrive [MQTT-3.1.2-25]; another subscriber gets them all."""
    u = uid()
    topic = f"{u}/big"
    small = raw_on(b2)
    small.connect(cid("mps"), props=[(MAXIMUM_PACKET_SIZE, 200)])
    small.subscribe([(f"{u}/#", qos)])
    other = Client(b2.port, cid("o"), protocol=V5).connect()
    other.subscribe(f"{u}/#", qos)
    fits = next(n for n in range(300, 0, -1) if publish_size(topic, n, qos) <= 200)
    assert publish_size(topic, fits, qos) == 200
    pub = paho_on(b2, "p", off=small.worker)
    sent = [b"x" * 1000, b"f" * fits, b"o" * (fits + 1), b"after"]
    for p in sent:
        pub.publish(topic, p, qos=qos)
    got = small.until_payload(b"after")
    assert [m.payload for m in got] == [b"f" * fits, b"after"]
    assert got[0].size == 200
    assert small.ping() == []
    assert [m.payload for m in other.wait_messages(4)] == sent


# == 8. Flow control ==============================================================================

def test_more_qos2_publishes_than_receive_maximum_is_disconnect_0x93(b2):
    """CONNACK Receive Maximum R: R QoS 2 PUBLISHes awaiting PUBREL are fine, completing one makes
    room for one more, and one beyond R is DISCONNECT 0x93 Receive Maximum exceeded (spec 3.3.4,
    [MQTT-3.3.4-7] is the client's side of it)."""
    u = uid()
    raw = raw_on(b2)
    r = raw.connect(cid("rm")).prop(RECEIVE_MAXIMUM)
    assert r is not None and 1 <= r <= 65535
    raw.send(b"".join(publish_bytes(f"{u}/q", b"x", 2, pid) for pid in range(1, r + 1)))
    recs = [raw.expect(PUBREC) for _ in range(r)]
    assert [p.pid for p in recs] == list(range(1, r + 1)) and all(p.reason < 0x80 for p in recs)
    raw.send(ack_bytes(PUBREL, 1))
    assert raw.expect(PUBCOMP).pid == 1
    raw.send(publish_bytes(f"{u}/q", b"x", 2, r + 1))
    assert raw.expect(PUBREC).pid == r + 1
    raw.send(publish_bytes(f"{u}/q", b"x", 2, r + 2))
    assert [(p.kind, p.reason) for p in raw.until_closed()] == [(DISCONNECT, 0x93)]


# == 9. PUBREC with an error code =================================================================

def test_pubrec_with_an_error_code_ends_the_qos2_flow(b2):
    """A subscriber (Receive Maximum 1) answers a QoS 2 PUBLISH with PUBREC 0x80: the flow ends there,
    no PUBREL follows (spec 4.3.3), its quota slot is free again [MQTT-3.3.4-9], so the next
    message comes and completes normally."""
    u = uid()
    sub = raw_on(b2)
    sub.connect(cid("prx"), props=[(RECEIVE_MAXIMUM, 1)])
    sub.subscribe([(f"{u}/t", 2)])
    pub = paho_on(b2, "p", off=sub.worker)
    pub.publish(f"{u}/t", b"refused", qos=2)
    first = sub.expect(PUBLISH)
    assert first.payload == b"refused" and first.qos == 2
    sub.send(ack_bytes(PUBREC, first.pid, 0x80))  # type: ignore[arg-type]
    pub.publish(f"{u}/t", b"next", qos=2)
    second = sub.recv()
    assert second.kind == PUBLISH and second.payload == b"next", f"expected the next message, got {second}"
    sub.send(ack_bytes(PUBREC, second.pid))  # type: ignore[arg-type]
    rel = sub.expect(PUBREL)
    assert rel.pid == second.pid
    sub.send(ack_bytes(PUBCOMP, second.pid))  # type: ignore[arg-type]
    assert sub.ping() == []


# == 10. Properties passed through unchanged ======================================================

USER_PROPS = [("k", "1"), ("a", "x"), ("k", "2"), ("k", "1"), ("ü", "ß")]


def rich_props(u: str) -> dict[str, Any]:
    return {"PayloadFormatIndicator": 1, "ContentType": "application/json", "ResponseTopic": f"{u}/reply",
            "CorrelationData": b"\x00\xffcorr\x01", "UserProperty": list(USER_PROPS), "MessageExpiryInterval": 300}


def rich_raw_props(u: str) -> Props:
    return [(PAYLOAD_FORMAT, 1), (CONTENT_TYPE, "application/json"), (RESPONSE_TOPIC, f"{u}/reply"),
            (CORRELATION_DATA, b"\x00\xffcorr\x01"), *((USER_PROPERTY, kv) for kv in USER_PROPS),
            (MESSAGE_EXPIRY, 300)]


def assert_rich(m: mqtt.MQTTMessage, u: str) -> None:
    """Payload Format Indicator [MQTT-3.3.2-4], Content Type [MQTT-3.3.2-20], Response Topic
    (spec 3.3.2.3.5), Correlation Data [MQTT-3.3.2-16], User Properties, all and in order
    [MQTT-3.3.2-17] [MQTT-3.3.2-18], unchanged; the expiry interval at most what was sent."""
    p = m.properties
    assert p.PayloadFormatIndicator == 1
    assert p.ContentType == "application/json"
    assert p.ResponseTopic == f"{u}/reply"
    assert p.CorrelationData == b"\x00\xffcorr\x01"
    assert p.UserProperty == USER_PROPS
    assert 290 <= p.MessageExpiryInterval <= 300


def assert_rich_raw(m: Pkt, u: str) -> None:
    """As ``assert_rich``, on the wire: the same properties in the same order (expiry aside)."""
    want = [x for x in rich_raw_props(u) if x[0] != MESSAGE_EXPIRY]
    assert [x for x in m.props if x[0] != MESSAGE_EXPIRY] == want, m.props
    assert 290 <= m.prop(MESSAGE_EXPIRY) <= 300


@pytest.mark.parametrize("where", ["same worker", "other worker"])
def test_properties_pass_through_unchanged(b2, where):
    """At QoS 0, 1 and 2, from a publisher on the subscriber's worker or the other."""
    u = uid()
    sub = paho_on(b2, "ps", protocol=V5)
    w = client_worker(b2, sub)
    sub.subscribe(f"{u}/#", 2)
    pub = paho_on(b2, "pp", protocol=V5, **({"on": w} if where == "same worker" else {"off": w}))
    for qos in (0, 1, 2):
        publish_v5(pub, f"{u}/q{qos}", b'{"q": %d}' % qos, qos, **rich_props(u))
    got = sub.wait_messages(3)
    assert sorted(m.topic for m in got) == [f"{u}/q0", f"{u}/q1", f"{u}/q2"]
    for m in got:
        assert_rich(m, u)


def test_properties_replayed_from_the_log_after_a_restart(start_broker, tmp_path):
    """A persistent session offline across a restart gets the message from the log with every
    property as published."""
    broker = start_broker(workers=2, data_dir=str(tmp_path / "data"))
    u = uid()
    name, _ = offline_session(broker, f"{u}/t", "prr")
    pub = raw_on(broker)
    pub.connect(cid("p"))
    pub.publish(f"{u}/t", b'{"r": 1}', 1, rich_raw_props(u))
    pub.disconnect()
    assert broker.stop() == 0
    broker.start()
    back = raw_on(broker)
    assert back.connect(name, clean=False, props=[(SESSION_EXPIRY, 300)]).session_present
    [m] = back.messages(lambda g: len(g) == 1)
    assert m.payload == b'{"r": 1}'
    assert_rich_raw(m, u)


def test_properties_kept_after_a_takeover_to_the_other_worker(b2):
    """A message queued for an offline session keeps its properties when the session moves to the
    other worker."""
    u = uid()
    name, home = offline_session(b2, f"{u}/t", "prt")
    pub = raw_on(b2, on=home)
    pub.connect(cid("p"))
    pub.publish(f"{u}/t", b'{"t": 1}', 1, rich_raw_props(u))
    back = raw_on(b2, off=home)
    assert back.connect(name, clean=False, props=[(SESSION_EXPIRY, 300)]).session_present
    [m] = back.messages(lambda g: len(g) == 1)
    assert_rich_raw(m, u)
    back.disconnect(0, [(SESSION_EXPIRY, 0)])


# == 12. No Local across workers ==================================================================

def test_no_local_across_workers(b2):
    """A No Local subscriber on worker A gets, right after each SUBACK, what a client on worker B
    publishes (20 times), and never its own messages [MQTT-3.8.3-3], although those are forwarded
    to worker B (a subscriber there gets them)."""
    u = uid()
    wa, wb = two_workers(b2)
    me = paho_on(b2, "nl", on=wa, protocol=V5)
    other = paho_on(b2, "np", on=wb)
    there = paho_on(b2, "nt", on=wb)
    there.subscribe(f"{u}/#", 1)
    for i in range(20):
        assert subscribe_v5(me, f"{u}/{i}", 1, no_local=True) == [1]
        me.publish(f"{u}/{i}", f"own{i}", qos=1)
        other.publish(f"{u}/{i}", f"other{i}", qos=1)
        me._wait(lambda i=i: any(m.payload == f"other{i}".encode() for m in me.messages), f"other{i}")
    there.wait_messages(40)
    assert [m.payload for m in me.messages] == [f"other{i}".encode() for i in range(20)]


def test_no_local_holds_for_a_session_moved_to_the_other_worker(b2):
    """A persistent No Local subscriber publishes, goes offline, and takes its session over on the
    other worker: it catches up on what others sent, never on its own messages [MQTT-3.8.3-3]."""
    u = uid()
    name = cid("nlm")
    me = raw_on(b2)
    me.connect(name, clean=False, props=[(SESSION_EXPIRY, 300)])
    me.subscribe([(f"{u}/t", 1 | NO_LOCAL)])
    me.publish(f"{u}/t", b"own", 1)
    me.close()
    pub = Client(b2.port, cid("p")).connect()
    pub.publish(f"{u}/t", b"other", qos=1)
    back = raw_on(b2, off=me.worker)
    assert back.connect(name, clean=False, props=[(SESSION_EXPIRY, 300)]).session_present
    back.publish(f"{u}/t", b"own-again", 1)
    pub.publish(f"{u}/t", b"marker", qos=1)
    got = back.until_payload(b"marker")
    assert [m.payload for m in got] == [b"other", b"marker"], got
    back.disconnect(0, [(SESSION_EXPIRY, 0)])


# == 14. Mosquitto's MQTT 5 clients ===============================================================

needs_mosquitto = pytest.mark.skipif(shutil.which("mosquitto_pub") is None,
                                     reason="mosquitto-clients not installed (./scripts/test installs it as root)")


@needs_mosquitto
def test_mosquitto_sub_v5_shows_user_properties_and_subscription_identifier(b2):
    """mosquitto_sub -V mqttv5 prints the User Properties (%P), Content Type (%C) and the
    Subscription Identifier it subscribed with (%S) of what a paho MQTT 5 client published."""
    u = uid()
    pub = Client(b2.port, cid("p"), protocol=V5).connect()
    publish_v5(pub, f"{u}/probe", b"probe", 1, retain=True)  # delivered on subscribe: it is subscribed
    sub = subprocess.Popen(["mosquitto_sub", "-V", "mqttv5", "-h", "127.0.0.1", "-p", str(b2.port),
                            "-t", f"{u}/#", "-q", "1", "-D", "subscribe", "subscription-identifier", "42",
                            "-F", "%t|%S|%C|%P|%p", "-C", "2", "-W", "20"], stdout=subprocess.PIPE, text=True)
    try:
        line = sub.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith(f"{u}/probe|42|"), line
        publish_v5(pub, f"{u}/t", b"hello", 1, ContentType="text/plain", UserProperty=[("k", "v"), ("k", "w")])
        out, _ = sub.communicate(timeout=20)
        assert out.strip().splitlines() == [f"{u}/t|42|text/plain|k:v k:w|hello"]
    finally:
        sub.kill()
        sub.wait(5)
        pub.publish(f"{u}/probe", b"", qos=1, retain=True)


@needs_mosquitto
def test_mosquitto_pub_v5_sends_user_properties_through(b2):
    """mosquitto_pub -V mqttv5 -D publish user-property ...: a paho MQTT 5 subscriber gets the User
    Properties in order, and the Content Type and Message Expiry Interval."""
    u = uid()
    sub = Client(b2.port, cid("s"), protocol=V5).connect()
    sub.subscribe(f"{u}/t", 1)
    subprocess.run(["mosquitto_pub", "-V", "mqttv5", "-h", "127.0.0.1", "-p", str(b2.port), "-t", f"{u}/t",
                    "-m", "from-mosquitto", "-q", "1", "-D", "publish", "user-property", "k", "v",
                    "-D", "publish", "user-property", "k", "v2", "-D", "publish", "content-type", "text/plain",
                    "-D", "publish", "message-expiry-interval", "120"], check=True, timeout=20)
    m = sub.wait_messages(1)[0]
    assert m.payload == b"from-mosquitto"
    assert m.properties.UserProperty == [("k", "v"), ("k", "v2")]
    assert m.properties.ContentType == "text/plain"
    assert 110 <= m.properties.MessageExpiryInterval <= 120
