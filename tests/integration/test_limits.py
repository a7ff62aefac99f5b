"""Limits: each is an option, each hit is visible, and a stuck subscriber hurts nobody else."""

from __future__ import annotations

import shutil
import socket

import pytest

from tests.helpers import Client, RawClient, cid, connect_packet, subscribe_packet


def test_max_connections_refuses_with_server_unavailable(start_broker):
    broker = start_broker("--max-connections", "2")
    a = Client(broker.port, cid("a")).connect()
    b = Client(broker.port, cid("b")).connect()
    raw = RawClient(broker.port)
    raw.send(connect_packet(cid("c")))
    assert raw.recv_until_closed() == b"\x20\x02\x00\x03"
    broker.wait_log("max connections")
    a.disconnect()
    Client(broker.port, cid("d")).connect()  # room again
    assert b.connack == (0, False)


def test_offline_queue_is_bounded_and_keeps_the_oldest(start_broker):
    broker = start_broker("--max-queued", "5", "--log", "off")  # memory only: the queue is the bound
    name = cid("bounded")
    c = Client(broker.port, name, clean=False).connect()
    c.subscribe("bq/t", 1)
    c.disconnect()
    pub = Client(broker.port, cid("p")).connect()
    for i in range(12):
        pub.publish("bq/t", str(i), qos=1)
    c2 = Client(broker.port, name, clean=False).connect()
    msgs = c2.wait_messages(5)
    pub.publish("bq/t", b"after", qos=1)
    c2.wait_topic("bq/t")
    c2.wait_messages(6)
    assert [m.payload.decode() for m in c2.messages] == ["0", "1", "2", "3", "4", "after"]
    assert len(msgs) >= 5


def _raw_subscriber(port: int, topic: bytes, qos: int) -> socket.socket:
    """A subscriber that never reads its socket."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(connect_packet(cid("stuck")))
    sock.sendall(subscribe_packet(1, [(topic.decode(), qos)]))
    return sock


def test_a_subscriber_that_does_not_read_does_not_stall_others(start_broker):
    broker = start_broker("--max-client-buffer", "65536", "--max-queued", "100")
    stuck0 = _raw_subscriber(broker.port, b"slow/t", 0)
    stuck1 = _raw_subscriber(broker.port, b"slow/t", 1)
    healthy = Client(broker.port, cid("healthy")).connect()
    healthy.subscribe("slow/t", 1)
    pub = Client(broker.port, cid("p")).connect()
    payload = b"x" * 4000
    n = 3000  # 12 MB: far beyond the stuck clients' socket buffers, window and queue
    for i in range(n):
        pub.publish("slow/t", i.to_bytes(4, "big") + payload, qos=1)  # each one acknowledged
    msgs = healthy.wait_messages(n, timeout=60)
    # Every message reached the healthy subscriber, in order, although two others never read.
    assert [int.from_bytes(m.payload[:4], "big") for m in msgs] == list(range(n))
    stuck0.close()
    stuck1.close()


def test_with_the_log_an_offline_session_catches_up_beyond_the_queue_limit(start_broker):
    broker = start_broker("--max-queued", "5")  # log on (the default)
    name = cid("catchup")
    c = Client(broker.port, name, clean=False).connect()
    c.subscribe("cu/#", 1)
    c.disconnect()
    pub = Client(broker.port, cid("p")).connect()
    for i in range(300):
        pub.publish(f"cu/{i % 3}", str(i), qos=1 + i % 2)
    pub.publish("other", b"not subscribed", qos=1)
    c2 = Client(broker.port, name, clean=False).connect()
    assert c2.session_present
    msgs = c2.wait_messages(300)
    assert [int(m.payload) for m in msgs] == list(range(300))  # granted QoS 1: all at QoS 1, in order
    assert {m.qos for m in msgs} == {1}
    pub.publish("cu/live", b"live", qos=1)
    assert c2.wait_topic("cu/live").payload == b"live"
    assert len(c2.messages) == 301

needs_prlimit = pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) is not installed")


@needs_prlimit
def test_open_files_limit_caps_connections_with_a_refusal_not_a_hang(start_broker):
    """A hard open-files limit of 300: the worker keeps FD_RESERVE for itself and refuses the
    clients beyond the rest with CONNACK "server unavailable" (none is left without an answer),
    and the supervisor says at start what bounds the connections and how to raise it."""
    from cluster.limits import FD_RESERVE

    broker = start_broker("--log", "off", prefix=["prlimit", "--nofile=300:300", "--"])
    broker.wait_log("open-files limit 300")
    assert "WARNING" in broker.log_text()
    cap = 300 - FD_RESERVE
    clients, answers = [], []
    for i in range(cap + 20):
        raw = RawClient(broker.port)
        raw.send(connect_packet(cid(f"fd{i}")))
        answers.append(raw.recv_exact(4))
        clients.append(raw)
    assert answers[:cap] == [b"\x20\x02\x00\x00"] * cap
    assert answers[cap:] == [b"\x20\x02\x00\x03"] * 20
    for raw in clients:
        raw.close()


@needs_prlimit
def test_supervisor_raises_the_soft_open_files_limit(start_broker):
    broker = start_broker("--log", "off", prefix=["prlimit", "--nofile=256:4096", "--"])
    broker.wait_log("open-files limit raised from 256 to 4096")
    raw = RawClient(broker.port)
    raw.send(connect_packet(cid("raised")))
    assert raw.recv_exact(4) == b"\x20\x02\x00\x00"
    with open(f"/proc/{broker.pid}/limits") as f:
        line = next(x for x in f if x.startswith("Max open files"))
    assert line.split()[3:5] == ["4096", "4096"]
    raw.close()
