"""Shared subscriptions across routers: one delivery per message per group, whichever worker or node
holds the publisher and the members."""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.cluster.conftest import client_worker, worker_of
from tests.cluster.test_multihost import start_nodes, wait_mesh_complete
from tests.helpers import WAIT, Broker, Client, wait_for
from tests.integration.test_shared import closes_clients, payloads, silent_member, wait_total

__all__ = ["closes_clients"]  # the autouse fixture applies here too


def by_worker(broker: Broker, prefix: str, want: int, per_worker: int = 1, limit: int = 60) -> dict[int, list[Client]]:
    """Connect clients until each of ``want`` workers holds ``per_worker`` of them (the kernel
    places connections; the workers' sockets say where each landed). Extra clients disconnect."""
    placed: dict[int, list[Client]] = {}
    for i in range(limit):
        c = Client(broker.port, f"{prefix}{i}-{uuid.uuid4().hex[:6]}").connect()
        held = placed.setdefault(client_worker(broker, c), [])
        if len(held) < per_worker:
            held.append(c)
        else:
            c.disconnect()
        if len(placed) == want and all(len(v) == per_worker for v in placed.values()):
            return placed
    raise AssertionError(f"clients landed on {len(placed)} of {want} workers in {limit} connections")


def test_members_on_three_workers_get_every_message_exactly_once(start_broker):
    broker = start_broker(workers=3)
    members = by_worker(broker, "m", 3)
    pubs = by_worker(broker, "p", 3)
    for [m] in members.values():
        assert m.subscribe("$share/g/cl/#", 1) == [1]
    n = 90
    for i in range(n):
        [pub] = pubs[list(pubs)[i % 3]]  # publishers on every worker, the members' own included
        pub.publish(f"cl/{i}", f"{i}", qos=1 if i % 2 else 0)
    everyone = [m for [m] in members.values()]
    wait_total(everyone, n)
    assert payloads(everyone) == Counter(f"{i}".encode() for i in range(n))
    assert all(m.messages for m in everyone), [len(m.messages) for m in everyone]


def test_members_share_evenly_however_they_are_spread_over_workers(start_broker):
    """Three members on one worker and one on the other: each gets about a quarter, not the lone
    member a half (routers are chosen by their number of connected members)."""
    broker = start_broker(workers=2)
    placed = by_worker(broker, "m", 2, per_worker=3)
    (_, crowd), (_, (lone, *extra)) = sorted(placed.items(), key=lambda kv: kv[1][0].c._client_id)
    for c in extra:
        c.disconnect()
    members = [*crowd, lone]
    for m in members:
        m.subscribe("$share/g/even/t", 1)
    pub = Client(broker.port, f"pub-{uuid.uuid4().hex[:6]}").connect()
    n = 80
    for i in range(n):
        pub.publish("even/t", f"{i}", qos=1)
    wait_total(members, n)
    assert payloads(members) == Counter(f"{i}".encode() for i in range(n))
    assert all(10 <= len(m.messages) <= 30 for m in members), [len(m.messages) for m in members]


def test_a_member_leaving_mid_stream_loses_nothing(start_broker):
    broker = start_broker(workers=2)
    placed = by_worker(broker, "m", 2, per_worker=2)
    (_, (a1, a2)), (_, (b1, b2)) = sorted(placed.items())
    for m in (a1, a2, b1, b2):
        m.subscribe("$share/g/mid/t", 1)
    pub = Client(broker.port, f"pub-{uuid.uuid4().hex[:6]}").connect()
    n = 200
    left = threading.Event()

    def leave() -> None:
        a2.wait_messages(5)
        a2.disconnect()  # what it had not acknowledged yet goes to another member
        left.set()

    t = threading.Thread(target=leave)
    t.start()
    for i in range(n):
        pub.publish("mid/t", f"{i}", qos=1)
    t.join(15)
    assert left.is_set()
    stayed = [a1, b1, b2]
    everything = {f"{i}".encode() for i in range(n)}
    wait_for(lambda: set(payloads([*stayed, a2])) == everything, WAIT, "every message, none lost")
    assert all(v == 1 for v in payloads(stayed).values())  # never twice to those who stayed
    # Twice at most for what the leaver received but had not acknowledged when it left (QoS 1:
    # at least once), never more than its window of 20.
    assert sum((payloads(stayed) & payloads([a2])).values()) <= 20
    pub.publish("mid/t", "after", qos=1)
    wait_payload(stayed, b"after")
    assert payloads(stayed)[b"after"] == 1 and not payloads([a2])[b"after"]


def wait_payload(clients: list[Client], payload: bytes) -> None:
    """Until one of ``clients`` received ``payload`` (bounded by WAIT)."""
    wait_for(lambda: payloads(clients)[payload], WAIT, f"a client to receive {payload!r}")


def test_takeover_moves_a_shared_membership_to_the_new_router(start_broker):
    broker = start_broker(workers=2)
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    client_id = f"tk-{uuid.uuid4().hex[:6]}"

    def connect() -> Client:
        return Client(broker.port, client_id, protocol=mqtt.MQTTv5, clean=False, properties=props).connect()

    first = connect()
    first.subscribe("$share/g/tk/t", 1)
    home = client_worker(broker, first)
    # Each connection taken over has its network thread stopped first: paho would connect it again
    # a second later, taking the session back (under load, before the messages below arrived).
    first.stop_loop()
    for _ in range(40):  # reconnect (a takeover each time) until the kernel picks the other worker
        again = connect()
        if client_worker(broker, again) != home:
            break
        again.stop_loop()
    else:
        raise AssertionError("every reconnect landed on the same worker")
    assert again.session_present
    pubs = by_worker(broker, "p", 2)
    for i, [pub] in enumerate(pubs.values()):
        pub.publish("tk/t", f"{i}", qos=1)
    again.wait_messages(2)
    assert sorted(m.payload for m in again.messages) == [b"0", b"1"]


def test_group_spread_over_two_nodes(start_broker):
    a, b, _c = start_nodes(start_broker)
    wait_mesh_complete([a, b, _c])
    ma = Client(a.port, f"ma-{uuid.uuid4().hex[:6]}", host=a.host).connect()
    mb = Client(b.port, f"mb-{uuid.uuid4().hex[:6]}", host=b.host).connect()
    for m in (ma, mb):
        m.subscribe("$share/g/nodes/#", 1)
    pub = Client(_c.port, f"pc-{uuid.uuid4().hex[:6]}", host=_c.host).connect()  # a node with no member
    n = 40
    for i in range(n):
        pub.publish(f"nodes/{i}", f"{i}", qos=1)
    wait_total([ma, mb], n)
    assert payloads([ma, mb]) == Counter(f"{i}".encode() for i in range(n))
    assert ma.messages and mb.messages


def test_a_vanished_members_messages_cross_to_a_member_elsewhere_and_only_to_it(start_broker):
    broker = start_broker(workers=2)
    [[other]] = list(by_worker(broker, "o", 1).values())
    home = client_worker(broker, other)
    for _ in range(40):  # a silent member on the other worker
        silent = silent_member(broker.port, "$share/g/x/t")
        if worker_of(broker, silent.sock.getsockname()[1]) != home:
            break
        silent.close()
    else:
        raise AssertionError("every silent member landed on the other member's worker")
    other.subscribe("$share/g/x/t", 1)
    for _ in range(40):  # a normal subscriber beside the other member: the hand-on must skip it
        normal = Client(broker.port, f"n-{uuid.uuid4().hex[:6]}").connect()
        if client_worker(broker, normal) == home:
            break
        normal.disconnect()
    else:
        raise AssertionError("no normal subscriber landed on the other member's worker")
    normal.subscribe("x/t", 1)
    pub = Client(broker.port, f"p-{uuid.uuid4().hex[:6]}").connect()
    n = 30
    for i in range(n):
        pub.publish("x/t", f"{i}", qos=1)
    normal.wait_messages(n)
    silent.close()
    other.wait_messages(n)
    want = Counter(f"{i}".encode() for i in range(n))
    assert payloads([other]) == want
    pub.publish("x/t", "end", qos=1)
    normal.wait_messages(n + 1)
    assert payloads([normal]) == want + Counter([b"end"])  # no second copy from the hand-on
