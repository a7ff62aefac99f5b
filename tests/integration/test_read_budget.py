"""The read budget: a long pipelined read is handled over several loop iterations, losing nothing.

With ``--read-budget 4`` (or a ``--turn-budget`` below the per-connection budget, or a
``--fan-budget`` of 2: two publishes to one subscriber) a read of hundreds
of packets is split into turns of a few packets with reading paused in between; every packet must
still be handled exactly once, in order, and packets after the publishes (PINGREQ, DISCONNECT) only
after them.
"""

from __future__ import annotations

import pytest

from tests.helpers import Client, RawClient, cid, connect_packet

N = 500


def _publish(topic: bytes, pid: int, payload: bytes) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + pid.to_bytes(2, "big") + payload
    return bytes([0x32, len(body)]) + body  # QoS 1, remaining length < 128


@pytest.mark.parametrize("budgets", [("--read-budget", "4"), ("--turn-budget", "2"), ("--turn-budget", "0"),
                                     ("--fan-budget", "2"), ("--turn-budget", "0", "--fan-budget", "2")])
def test_a_long_read_is_handled_in_turns_in_order_and_completely(start_broker, budgets):
    broker = start_broker(*budgets)
    topic = f"budget/{cid('t')}"
    sub = Client(broker.port, cid("sub")).connect()
    sub.subscribe(topic, qos=1)

    raw = RawClient(broker.port)
    stream = connect_packet(cid("pub"))
    stream += b"".join(_publish(topic.encode(), i + 1, b"m%04d" % i) for i in range(N))
    stream += b"\xc0\x00"  # PINGREQ
    stream += b"\xe0\x00"  # DISCONNECT
    raw.send(stream)  # one write: the broker reads it in few, large reads

    reply = raw.recv_until_closed()
    assert reply[:4] == b"\x20\x02\x00\x00"  # CONNACK accepted
    acks = reply[4:4 + 4 * N]
    expected = b"".join(b"\x40\x02" + (i + 1).to_bytes(2, "big") for i in range(N))
    assert acks == expected  # every PUBACK, in order
    assert reply[4 + 4 * N:] == b"\xd0\x00"  # PINGRESP after all of them, then the close

    got = [m.payload for m in sub.wait_messages(N)]
    assert got == [b"m%04d" % i for i in range(N)]
    sub.disconnect()
