"""Agreed session ownership end to end (issue 41, ``cluster.agreement.owners``): three real nodes
with ``--agreement``, paho clients. A persistent session moves between nodes with its messages and
its record; a reconnect while the session's owner is stopped is refused (server unavailable),
never given an empty session (pattern D); a node cut off from the majority refuses persistent
sessions; a copy left on a node that was stopped while its session moved hands on what was queued
there once it runs again (pattern A's loss)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.cluster.test_agreement_service import agreement_pid
from tests.helpers import Broker, Client, cid, free_port, in_parallel, mesh_key, wait_for

SERVER_UNAVAILABLE = (3, 0x88)  # MQTT 3.1.1's CONNACK code, as paho reports it (MQTT 5's reason code)


@pytest.fixture
def nodes(start_broker) -> list[Broker]:
    mesh = [free_port() for _ in range(3)]
    agree = [free_port() for _ in range(3)]

    def node(i: int) -> Broker:
        args = ["--mesh", f"127.0.0.1:{mesh[i]}", *mesh_key(), "--agreement", f"127.0.0.1:{agree[i]}",
                "--mesh-timeout", "1"]
        for j in range(3):
            if j != i:
                args += ["--peer", f"127.0.0.1:{mesh[j]}", "--agreement-peer", f"127.0.0.1:{agree[j]}"]
        return start_broker(*args, node_id="abc"[i])

    brokers = in_parallel(*(lambda i=i: node(i) for i in range(3)))
    for b in brokers:  # every member can commit (its first majority comes within a second or two)
        wait_for(lambda b=b: _persistent_ok(b), 30, f"node {b.name} serving persistent sessions")
    return brokers


def _persistent_ok(broker: Broker) -> bool:
    probe = Client(broker.port, cid("probe"), clean=False)
    try:
        probe.connect()
    except AssertionError:
        return False
    probe.disconnect()
    return True


def connect_until_accepted(port: int, client_id: str, timeout: float = 30.0) -> Client:
    """Connect as a client behind a retrying load balancer would: refusals are retried."""
    deadline = time.monotonic() + timeout
    while True:
        c = Client(port, client_id, clean=False)
        c.c.connect(c.host, c.port, c.keepalive)
        c.c.loop_start()
        c._wait(lambda c=c: c.connack is not None, "CONNACK")
        if c.connack[0] == 0:
            return c
        c.c.disconnect()
        c.c.loop_stop()
        assert c.connack[0] in SERVER_UNAVAILABLE, c.connack
        assert time.monotonic() < deadline, f"{client_id} refused for {timeout} s"
        time.sleep(0.3)


def test_a_session_moves_with_its_messages_and_its_record(nodes: list[Broker]) -> None:
    a, b, c = nodes
    sub_id = cid("roamer")
    sub = Client(a.port, sub_id, clean=False).connect()
    sub.subscribe("agreed/t", qos=1)
    sub.disconnect()
    pub = Client(c.port, cid("pub")).connect()
    for i in range(20):
        pub.c.publish("agreed/t", f"m{i}".encode(), qos=1).wait_for_publish(10)
    sub2 = connect_until_accepted(b.port, sub_id)
    assert sub2.session_present
    got = {m.payload for m in sub2.wait_messages(20)}
    assert got == {f"m{i}".encode() for i in range(20)}
    assert sub_id not in _lines(b, "new persistent session")


def _lines(broker: Broker, text: str) -> str:
    return "\n".join(line for line in broker.log_text().splitlines() if text in line)


def test_a_reconnect_while_the_owner_is_stopped_is_refused_not_emptied(nodes: list[Broker]) -> None:
    """Pattern D: the session's owner is stopped (not yet taken for gone); the reconnect elsewhere
    gets a refusal while nobody can hand the session over, then the session itself, never an empty one."""
    a, b, c = nodes
    sub_id = cid("held")
    sub = Client(a.port, sub_id, clean=False).connect()
    sub.subscribe("agreed/held", qos=1)
    sub.disconnect()
    pub = Client(b.port, cid("pub")).connect()
    pub.c.publish("agreed/held", b"before", qos=1).wait_for_publish(10)
    pids = [a.pid, *(p for p in _children(a))]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        late = Client(c.port, sub_id, clean=False)
        late.c.connect(late.host, late.port, late.keepalive)
        late.c.loop_start()
        late._wait(lambda: late.connack is not None, "CONNACK", timeout=30)
        assert late.connack[0] in SERVER_UNAVAILABLE or late.connack[1], \
            f"an empty session instead of a refusal: {late.connack}"
        if late.connack[0] == 0:  # served from the replica once a counted as gone: with its message
            late.wait_messages(1)
        late.c.disconnect()
        late.c.loop_stop()
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    back = connect_until_accepted(c.port, sub_id, timeout=60)
    assert back.session_present
    got = {m.payload for m in late.messages} | {m.payload for m in back.wait_messages(0)}
    if b"before" not in got:
        got |= {m.payload for m in back.wait_messages(1)}
    assert b"before" in got


def _children(broker: Broker) -> list[int]:
    from tests.helpers import child_pids

    return child_pids(broker.pid)


def test_a_node_whose_member_cannot_commit_refuses_persistent_sessions(nodes: list[Broker]) -> None:
    a, b, c = nodes
    stopped = [agreement_pid(b), agreement_pid(c)]
    assert all(stopped)
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        def refused() -> bool:
            probe = Client(a.port, cid("cut"), clean=False)
            probe.c.connect(probe.host, probe.port, probe.keepalive)
            probe.c.loop_start()
            probe._wait(lambda: probe.connack is not None, "CONNACK", timeout=30)
            probe.c.disconnect()
            probe.c.loop_stop()
            return probe.connack[0] in SERVER_UNAVAILABLE

        wait_for(refused, 20, "a persistent CONNECT refused on the node that cannot commit")
        clean = Client(a.port, cid("clean"), clean=True).connect()  # clean sessions need no agreement
        clean.disconnect()
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    connect_until_accepted(a.port, cid("after"), timeout=30)
