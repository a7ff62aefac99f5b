"""The benchmark's own MQTT bytes and flow control: if these are wrong, every figure is wrong.

No processes, no sockets: packets are checked against hand-computed bytes, the subscriber's counter
against arbitrary splits of a stream, and the publisher's window against a fake transport.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from mqttbench import mqtt_wire as wire  # noqa: E402
from mqttbench.loadgen import MANY_PUBLISHERS, Conn, Group, Publisher, Subscriber  # noqa: E402
from mqttbench.runner import percentile  # noqa: E402
from mqttbench.scenarios import GroupSpec, Sizes, build  # noqa: E402


@pytest.mark.parametrize("n", [0, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 268_435_455])
def test_remaining_length_round_trip(n: int) -> None:
    enc = wire.encode_remaining_length(n)
    assert len(enc) == 1 + (n > 127) + (n > 16_383) + (n > 2_097_151)
    assert wire.decode_remaining_length(b"\x30" + enc, 1) == (n, 1 + len(enc))
    assert wire.decode_remaining_length(b"\x30" + enc[:-1], 1) is None


def test_connect_bytes() -> None:
    assert wire.connect("a") == bytes.fromhex("100d00044d51545404020000") + b"\x00\x01a"


def test_subscribe_and_publish_bytes() -> None:
    assert wire.subscribe(1, "t/#", 1) == bytes.fromhex("82080001") + b"\x00\x03t/#\x01"
    assert wire.publish("t", b"xy") == b"\x30\x05\x00\x01txy"
    assert wire.publish("t", b"xy", qos=1, packet_id=258) == b"\x32\x07\x00\x01t\x01\x02xy"
    assert wire.PUBACKS[258] == b"\x40\x02\x01\x02"
    big = wire.publish("t", b"z" * 1024)
    assert big[:3] == b"\x30\x83\x08" and len(big) == 3 + 3 + 1024


def _stream() -> tuple[bytes, int]:
    rng = random.Random(7)
    packets = [
        wire.publish(f"bench/p2p/{rng.randrange(100)}", b"p" * rng.choice([16, 1024, 200_000]), qos=rng.choice([0, 1]),
                     packet_id=rng.randrange(1, 65536))
        for _ in range(300)
    ]
    return b"".join(packets), len(packets)


def test_count_packets_over_any_split() -> None:
    stream, total = _stream()
    rng = random.Random(11)
    for _ in range(20):
        counted, buf, pos = 0, b"", 0
        while pos < len(stream):
            step = rng.choice([1, 2, 3, 50, 1500, 65536, 300_000])
            buf += stream[pos : pos + step]
            pos += step
            n, used = wire.count_packets(buf)
            counted += n
            buf = buf[used:]
        assert counted == total and buf == b""


@pytest.mark.parametrize("payload", [16, 1024, 20_000])
def test_count_same_agrees_with_count_packets_and_refuses_other_shapes(payload: int) -> None:
    packet = wire.publish("bench/p2p/3", b"p" * payload)
    head, plen = wire.fixed_header(packet)  # type: ignore[misc]
    assert plen == len(packet) and packet.startswith(head) and len(head) in (2, 3, 4)
    stream = packet * 7 + packet[:5]
    assert wire.count_same(stream, 0, plen, head) == wire.count_packets(stream) == (7, 7 * plen)
    assert wire.count_same(stream, plen, plen, head) == (6, 7 * plen)
    assert wire.count_same(packet[:-1], 0, plen, head) == (0, 0)
    other = wire.publish("bench/p2p/30", b"p" * payload)  # one byte longer: framing shifts
    assert wire.count_same(packet * 3 + other + packet * 3, 0, plen, head)[0] == -1


def test_a_subscriber_counts_a_stream_of_mixed_sizes_right() -> None:
    """count_same is tried on every read after the first; reads whose packets differ fall back
    to count_packets, and after MAX_MISSES of them the subscriber stops trying."""
    sub, sconn = _qos0_subscriber("bench/#")
    same = wire.publish("bench/a", b"x" * 16)
    mixed = [wire.publish(f"bench/{'b' * (i % 5)}", b"y" * (i % 300)) for i in range(400)]
    stream = same * 500 + b"".join(mixed) + same * 50
    rng = random.Random(3)
    pos = 0
    while pos < len(stream):
        step = rng.choice([3, 50, 1500, 4096])
        sconn.data_received(stream[pos : pos + step])
        pos += step
    assert sub.received == 950 and sub.bad == 0 and sub.buf == b""
    assert sub.misses > 0


def test_publish_topic() -> None:
    pkt = wire.publish("bench/fanin/3", b"x" * 1024)
    assert wire.publish_topic(pkt) == b"bench/fanin/3"
    assert wire.publish_topic(pkt[:5]) is None
    assert wire.publish_topic(wire.puback(1)) == b""


class FakeTransport:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return False


def _conn() -> tuple[Conn, FakeTransport]:
    conn = Conn(lambda c, e: None)
    t = FakeTransport()
    conn.transport = t  # type: ignore[assignment]
    return conn, t


def test_publisher_respects_window_and_resumes_on_delivery() -> None:
    group = Group(GroupSpec(0, fan=2, qos=0, window=10), 0, 1, True, None, None)
    conn, t = _conn()
    pub = Publisher(conn, group, "t", b"0123456789abcdef", qos=0, inflight=0, rate=0.0)
    group.publishers.append(pub)
    plen = len(wire.publish("t", b"0123456789abcdef"))
    pub.start(0.0)
    assert len(t.data) == 10 * plen and group.pub == 10
    group.add_dlv(8)  # fan 2: 8 deliveries are 4 publishes done
    assert group.pub == 14 and wire.count_packets(bytes(t.data)) == (14, len(t.data))
    conn.paused = True
    group.add_dlv(20)
    assert group.pub == 14  # paused transport: nothing written
    conn.resume_writing()
    assert group.pub == 24


def test_qos1_publisher_inflight_and_subscriber_acks() -> None:
    group = Group(GroupSpec(0, fan=1, qos=1, window=1000), 0, 1, True, None, None)
    pconn, pt = _conn()
    pub = Publisher(pconn, group, "q", b"x" * 16, qos=1, inflight=5, rate=0.0)
    group.publishers.append(pub)
    pub.start(0.0)
    assert pub.sent == 5
    sconn, st = _conn()
    sub = Subscriber(sconn, group, 1, "q")
    sent = bytes(pt.data)
    sconn.data_received(sent[:7])  # partial packet first
    sconn.data_received(sent[7:])
    assert sub.received == 5 and sub.bad == 0
    assert bytes(st.data) == b"".join(wire.puback(i) for i in range(1, 6))
    pconn.data_received(bytes(st.data))  # the broker's PUBACKs free the inflight window
    assert pub.acked == 5 and pub.sent == 10



def test_a_delivery_does_not_make_a_fleets_devices_publish() -> None:
    """A fleet's devices publish on their own clocks (the generator's tick), not whenever a
    subscriber reads: a delivery that pumped every publisher sent all the devices due at that
    moment back to back, and the broker met the fleet as one burst a second."""
    n = MANY_PUBLISHERS + 1
    group = Group(GroupSpec(0, fan=2, qos=0, window=10 * n, rate=float(n)), 0, 1, True, None, None)
    pubs = []
    for i in range(n):
        conn, _ = _conn()
        pub = Publisher(conn, group, f"bench/fleet/{i}", b"x" * 16, qos=0, inflight=0, rate=1.0, cap=1)
        group.publishers.append(pub)
        pubs.append(pub)
        pub.start(time.monotonic())  # not due for a second
    assert group.pub == 0
    for pub in pubs:
        pub.t_start -= 1.0  # a second later: every device is due
    group.add_dlv(2)
    assert group.pub == 0, "a delivery made the fleet's devices publish"
    for pub in pubs:  # the tick's visits do
        pub.pump()
    assert group.pub == n and all(p.sent == 1 for p in pubs)

def _qos0_subscriber(topic_filter: str) -> tuple[Subscriber, Any]:
    group = Group(GroupSpec(0, fan=1, qos=0, window=10), 0, 1, True, None, None)
    sconn, _ = _conn()
    return Subscriber(sconn, group, 0, topic_filter), sconn


def test_subscriber_flags_foreign_stream() -> None:
    sub, sconn = _qos0_subscriber("bench/p2p/1")
    sconn.data_received(wire.publish("other", b"x"))
    assert sub.bad == 1 and sub.received == 1


def test_scenarios_shape() -> None:
    sizes = Sizes()
    p2p = build("p2p", 16, 2, sizes)
    assert sum(c.role == "pub" for c in p2p.clients) == sizes.pairs
    assert {c.proc for c in p2p.clients if not p2p.groups[c.gid].side} == {0, 1}
    # The side channel is timed in a process of its own, one more than --procs.
    assert p2p.procs == 3 and [(c.role, c.proc) for c in p2p.clients if p2p.groups[c.gid].side] == [
        ("lat_sub", 2), ("lat_pub", 2)]
    among = build("p2p", 16, 2, Sizes(probe_alone=False))  # --probe-with-load
    assert among.procs == 2 and {c.proc for c in among.clients if among.groups[c.gid].side} == {0}
    fanout = build("fanout", 1024, 1, sizes)
    assert fanout.groups[0].fan == sizes.subscribers
    fanin = build("fanin", 16, 1, sizes)
    assert sum(c.role == "pub" for c in fanin.clients) == sizes.publishers
    assert any(c.topic == "bench/fanin/#" for c in fanin.clients)
    conn = build("conn", 16, 3, sizes)
    assert conn.payload == 0 and len(conn.clients) == sizes.connections and not conn.groups
    lat = build("latency", 16, 1, sizes)
    assert sum(g.rate for g in lat.groups if not g.side) == pytest.approx(sizes.latency_load)
    assert [c.role for c in lat.clients if lat.groups[c.gid].side] == ["lat_sub", "lat_pub"]
    shared = build("sharedsub", 1024, 2, sizes)
    assert shared.payload == 1024 and shared.groups[0].fan == 1  # one delivery per message per group
    subs = [c for c in shared.clients if c.role == "sub"]
    assert len(subs) == sizes.members and {c.topic for c in subs} == {"$share/bench/bench/shared/#"}
    assert sum(c.role == "pub" for c in shared.clients) == sizes.publishers


def test_a_group_member_checks_topics_against_the_filter_inside_the_share() -> None:
    sub, sconn = _qos0_subscriber("$share/bench/bench/shared/#")
    sconn.data_received(wire.publish("bench/shared/3", b"x"))
    assert sub.bad == 0 and sub.received == 1
    sconn.data_received(wire.publish("other", b"x"))
    assert sub.bad == 1


def test_percentile_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([5], 99) == 5
