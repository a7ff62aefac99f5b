"""Persistent sessions: offline queue, session present, redelivery with DUP, takeover."""

from __future__ import annotations

import time

import msgpack
import pytest

from tests.helpers import (
    Broker,
    Client,
    RawClient,
    cid,
    connect_packet,
    read_packet,
    subscribe_packet,
    wait_for,
)


@pytest.fixture
def broker(on_file_broker: Broker) -> Broker:
    """One broker for the tests of this file that take the defaults (tests/conftest.py's
    ``file_broker``): each its own client ids and topics, nothing retained, and the takeover line
    awaited is the test's own client's."""
    return on_file_broker


def test_persistent_session_keeps_subscriptions_and_queues_qos1_qos2(broker):
    name = cid("persist")
    c = Client(broker.port, name, clean=False).connect()
    assert not c.session_present
    c.subscribe("ps/#", 2)
    c.disconnect()
    pub = Client(broker.port, cid("p")).connect()
    for i in range(10):
        pub.publish("ps/x", f"{i}", qos=1 + i % 2)
    pub.publish("ps/x", b"qos0-dropped-offline", qos=0)
    c2 = Client(broker.port, name, clean=False).connect()
    assert c2.session_present
    msgs = c2.wait_messages(10)
    # paho hands a QoS 2 message over only after PUBREL, so compare the order within each QoS.
    for qos in (1, 2):
        got = [int(m.payload) for m in msgs[:10] if m.qos == qos]
        assert got == [i for i in range(10) if 1 + i % 2 == qos]
    # QoS 0 is not queued for an offline session (as Mosquitto by default).
    pub.publish("ps/x", b"live", qos=1)
    c2.wait_topic("ps/x")
    c2.wait_messages(11)
    assert b"qos0-dropped-offline" not in [m.payload for m in c2.messages]


def test_clean_session_discards_the_old_one(broker):
    name = cid("cleaner")
    c = Client(broker.port, name, clean=False).connect()
    c.subscribe("cs/#", 1)
    c.disconnect()
    c2 = Client(broker.port, name, clean=True).connect()
    assert not c2.session_present
    c2.disconnect()
    c3 = Client(broker.port, name, clean=False).connect()
    assert not c3.session_present



def test_unacknowledged_messages_redelivered_with_dup_on_reconnect(broker):
    name = cid("redeliver")
    raw = RawClient(broker.port)
    raw.send(connect_packet(name, clean=False))
    assert raw.recv_exact(4) == b"\x20\x02\x00\x00"
    raw.send(subscribe_packet(1, [("rd/t", 1)]))
    assert raw.recv_exact(5) == b"\x90\x03\x00\x01\x01"
    pub = Client(broker.port, cid("p")).connect()
    pub.publish("rd/t", b"unacked", qos=1)
    first = read_packet(raw)
    assert first[0] == 0x32 and first.endswith(b"unacked")  # QoS 1, DUP 0
    pid = first[2 + 2 + 4: 2 + 2 + 4 + 2]
    raw.close()  # no PUBACK
    raw2 = RawClient(broker.port)
    raw2.send(connect_packet(name, clean=False))
    assert raw2.recv_exact(4) == b"\x20\x02\x01\x00"  # session present
    again = read_packet(raw2)
    assert again[0] == 0x3A  # QoS 1 with DUP set
    assert again[8:10] == pid and again.endswith(b"unacked")
    raw2.send(b"\x40\x02" + pid)
    pub.publish("rd/t", b"next", qos=1)
    nxt = read_packet(raw2)
    assert nxt[0] == 0x32 and nxt.endswith(b"next")
    raw2.close()


def test_same_client_id_takes_over_and_closes_the_old_connection(broker):
    name = cid("twin")
    old = Client(broker.port, name, clean=False).connect()
    old.subscribe("tk/#", 1)
    new = Client(broker.port, name, clean=False)
    new.c.reconnect_delay_set(60, 120)  # paho must not fight back for the client id
    old.c.reconnect_delay_set(60, 120)
    new.connect()
    assert new.session_present
    assert old.disconnected.wait(10)
    pub = Client(broker.port, cid("p")).connect()
    pub.publish("tk/x", b"to-new", qos=1)
    assert new.wait_topic("tk/x").payload == b"to-new"
    broker.wait_line(f"client {name} (", "taken over")


def test_a_clean_session_is_not_resumed_by_a_takeover_that_asks_for_a_persistent_one(broker):
    """MQTT-3.1.2-6: the state of a clean session (CleanSession 1) must not be reused in any later
    session, also when a CleanSession 0 connection of the same client id takes the live one over:
    session present 0, and the old connection's subscription is gone. Tried until the takeover has
    happened both on the same worker and across workers (the kernel places the connections)."""
    from tests.cluster.conftest import client_worker

    pub = Client(broker.port, cid("p")).connect()
    seen: set[bool] = set()
    for i in range(16):
        name = cid(f"clean-then-kept{i}")
        old = Client(broker.port, name, clean=True).connect()
        old.c.reconnect_delay_set(60, 120)  # paho must not fight back for the client id
        old.subscribe(f"ct{i}/old", 1)
        old_worker = client_worker(broker, old)
        new = Client(broker.port, name, clean=False)
        new.c.reconnect_delay_set(60, 120)
        new.connect()
        same_worker = client_worker(broker, new) == old_worker
        assert not new.session_present, f"round {i} (same worker: {same_worker}): a clean session was resumed"
        assert old.disconnected.wait(10)
        new.subscribe(f"ct{i}/marker", 1)
        pub.publish(f"ct{i}/old", b"old", qos=1)
        pub.publish(f"ct{i}/marker", b"marker", qos=1)  # same publisher: after "old", if that came
        new.wait_payload(b"marker")
        assert [m.payload for m in new.messages] == [b"marker"], f"round {i}: the old subscription survived"
        seen.add(same_worker)
        new.disconnect()
        if len(seen) == 2:
            break
    assert seen == {True, False}, f"takeovers seen only with same worker = {seen}"


def test_the_session_snapshot_is_rewritten_when_a_position_moved_not_every_second(start_broker, tmp_path):
    """``state.msgpack`` (persistent sessions and their positions in the log) is rewritten when a
    position may have moved (the log grew, a client acknowledged), not once a second regardless:
    an idle worker with 6,000 persistent sessions spent most of its CPU rebuilding and writing it
    (17 ms a second, 600 KB of writes). One worker: one router directory to watch."""
    broker = start_broker(workers=1)
    state = tmp_path / "data" / "t" / "w0" / "state.msgpack"
    name = cid("idle")

    def session() -> dict | None:
        try:
            return msgpack.unpackb(state.read_bytes(), strict_map_key=False)["sessions"].get(name)
        except (OSError, ValueError):
            return None

    sub = Client(broker.port, name, clean=False).connect()
    sub.subscribe("idle/#", 1)
    wait_for(lambda: session() is not None and session()["subs"], what="the session in the snapshot")
    before = state.stat()
    position = session()["position"]
    # Nothing may happen here, so the test must wait: over two of the snapshot's 1 s refreshes.
    time.sleep(2.5)
    after = state.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "rewritten while idle"
    pub = Client(broker.port, cid("p")).connect()
    pub.publish("idle/x", b"one", qos=1)
    sub.wait_messages(1)  # paho acknowledges it
    wait_for(lambda: session()["position"] > position, what="the acknowledged position in the snapshot")
