"""Limits: each is an option, each hit is visible, and a stuck subscriber hurts nobody else."""

from __future__ import annotations

import socket

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
