"""Retained messages and last wills."""

from __future__ import annotations

import os
import signal

import pytest

from tests.cluster.conftest import client_worker
from tests.helpers import WAIT, Broker, Client, cid, freeze, wait_for


@pytest.fixture
def broker(on_file_broker: Broker) -> Broker:
    """One broker for the tests of this file that take the defaults (tests/conftest.py's
    ``file_broker``): each its own client ids, and its topics under a root of its own (``cid``),
    so that what one retains no other's wildcard gets; the one '#' asserts only an absence."""
    return on_file_broker


def test_retained_stored_replaced_and_cleared(broker):
    r = cid("r")
    pub = Client(broker.port, cid("p")).connect()
    pub.publish(f"{r}/a", b"v1", qos=1, retain=True)
    pub.publish(f"{r}/a", b"v2", qos=1, retain=True)  # replaces
    pub.publish(f"{r}/b", b"b1", qos=0, retain=True)
    s1 = Client(broker.port, cid("s1")).connect()
    s1.subscribe(f"{r}/+", 1)
    msgs = s1.wait_messages(2)
    got = {m.topic: (m.payload, m.retain, m.qos) for m in msgs}
    assert got == {f"{r}/a": (b"v2", True, 1), f"{r}/b": (b"b1", True, 0)}
    # Live messages on an established subscription arrive with RETAIN 0.
    pub.publish(f"{r}/a", b"v3", qos=1, retain=True)
    live = s1.wait_messages(3)[2]
    assert (live.payload, live.retain) == (b"v3", False)
    # An empty retained payload clears it.
    pub.publish(f"{r}/a", b"", qos=1, retain=True)
    s2 = Client(broker.port, cid("s2")).connect()
    s2.subscribe(f"{r}/#", 1)
    pub.publish(f"{r}/zz", b"marker", qos=1)
    s2.wait_topic(f"{r}/zz")
    assert [(m.topic, m.payload) for m in s2.messages] == [(f"{r}/b", b"b1"), (f"{r}/zz", b"marker")]


def test_retained_not_matched_by_leading_wildcard_for_dollar_topics(broker):
    hidden, seen = f"${cid('x')}/r", f"{cid('vis')}/r"
    pub = Client(broker.port, cid("p")).connect()
    pub.publish(hidden, b"hidden", qos=1, retain=True)
    pub.publish(seen, b"seen", qos=1, retain=True)
    s = Client(broker.port, cid("s")).connect()
    s.subscribe("#", 0)
    s.wait_topic(seen)
    assert hidden not in [m.topic for m in s.messages]


def test_will_published_on_abnormal_close(broker):
    wills = cid("wills")
    watcher = Client(broker.port, cid("w")).connect()
    watcher.subscribe(f"{wills}/#", 1)
    dying = Client(broker.port, cid("dying"), will=(f"{wills}/dying", b"bye", 1, False)).connect()
    dying.drop()
    m = watcher.wait_topic(f"{wills}/dying")
    assert (m.payload, m.qos) == (b"bye", 1)


def test_no_will_after_disconnect(broker):
    wills = cid("wills")
    watcher = Client(broker.port, cid("w")).connect()
    watcher.subscribe(f"{wills}/#", 1)
    polite = Client(broker.port, cid("polite"), will=(f"{wills}/polite", b"bye", 1, False)).connect()
    polite.disconnect()
    marker = Client(broker.port, cid("m")).connect()
    marker.publish(f"{wills}/marker", b"m", qos=1)
    watcher.wait_topic(f"{wills}/marker")
    assert [m.topic for m in watcher.messages] == [f"{wills}/marker"]


def test_retained_will(broker):
    topic = f"{cid('wills')}/ret"
    watcher = Client(broker.port, cid("w")).connect()
    watcher.subscribe(topic, 1)
    dying = Client(broker.port, cid("d"), will=(topic, b"last", 1, True)).connect()
    dying.drop()
    # The broker publishes the will when it notices the close, on the dying client's worker: once
    # the watcher has it, it is retained there and sent on to the other worker, and only a
    # subscriber that comes after that gets it as a retained message (before: live, RETAIN 0).
    watcher.wait_topic(topic)
    late = Client(broker.port, cid("late")).connect()
    late.subscribe(topic, 1)
    m = late.wait_topic(topic)
    assert (m.payload, m.retain) == (b"last", True)



def test_a_retained_message_published_while_the_suback_waits_arrives_once(broker):
    """The subscriber's SUBACK waits for the other worker's acknowledgement of its new filter; a
    retained message published on the subscriber's own worker meanwhile reaches it once, live or
    as the retained one, not both. The other worker is stopped (SIGSTOP) for that moment, so the
    wait lasts until the test lets it end: no timing is left to chance."""
    sub = Client(broker.port, cid("once-sub")).connect()
    here = client_worker(broker, sub)
    pubs: list[Client] = []
    wait_for(lambda: client_worker(broker, pubs.append(Client(broker.port, cid("once-pub")).connect())
                                   or pubs[-1]) == here, WAIT, "a publisher on the subscriber's worker")
    pub = pubs[-1]
    [other] = [w for w in broker.workers() if w != here]
    topic = cid("once")
    freeze(other)
    try:
        mid = sub.send_subscribe(topic, 1)
        # Live on its worker before the SUBACK: probes until one comes through (bounded).
        wait_for(lambda: pub.publish(topic, b"probe") or any(m.payload == b"probe" for m in sub.messages),
                 WAIT, "the subscription live before its SUBACK")
        pub.publish(topic, b"kept", qos=1, retain=True)
        sub.wait_payload(b"kept")
    finally:
        os.kill(other, signal.SIGCONT)
    sub.wait_suback(mid)
    pub.publish(topic, b"marker", qos=1)  # after everything: the retained copy, if any, came first
    sub.wait_payload(b"marker")
    kept = [m.retain for m in sub.messages if m.payload == b"kept"]
    assert len(kept) == 1, f"the retained message arrived {len(kept)} times (RETAIN flags {kept})"


def test_a_crashed_workers_connected_persistent_client_has_its_will_published(start_broker, tmp_path):
    """A crash closes the connections of its worker without a DISCONNECT: the will of a
    persistent session's client that was connected is in the worker's snapshot (``live_will``),
    and the restarted worker publishes it (MQTT 3.1.2.5: a connection closed without DISCONNECT).
    Before, it was lost with the process. A watcher on the other worker gets it."""
    import msgpack

    broker = start_broker(data_dir=str(tmp_path / "data"))
    dev_id = cid("dev")
    device = Client(broker.port, dev_id, clean=False, will=("wills/crash", b"gone", 1, False)).connect()
    here = client_worker(broker, device)
    watchers: list[Client] = []
    wait_for(lambda: client_worker(broker, watchers.append(Client(broker.port, cid("w")).connect())
                                   or watchers[-1]) != here, WAIT, "a watcher on the other worker")
    watcher = watchers[-1]
    watcher.subscribe("wills/#", 1)

    def in_snapshot() -> bool:  # written within a second of the CONNECT
        for w in ("w0", "w1"):
            try:
                with open(tmp_path / "data" / "t" / w / "state.msgpack", "rb") as f:
                    st = msgpack.unpackb(f.read(), strict_map_key=False)["sessions"].get(dev_id)
            except (OSError, ValueError, KeyError):
                continue
            if st and st.get("live_will"):
                return True
        return False

    wait_for(in_snapshot, WAIT, "the connected client's will in its worker's snapshot")
    device.stop_loop()  # no reconnection: a client back before the will went out would cancel it
    os.kill(here, signal.SIGKILL)
    m = watcher.wait_topic("wills/crash", timeout=30)
    assert (m.payload, m.qos) == (b"gone", 1)
