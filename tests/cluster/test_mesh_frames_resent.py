"""Frames other than PUBLISH lost with a connection, on a real broker (mesh version 23; the rules
with values: tests/unit/test_mesh_frames_lost.py). A fake router of another node speaks the mesh
to one router: it loses a numbered frame the broker sent (an INTEREST: its filter, unknown there,
would have kept its subscribers' messages away) and names it missed in its HELLO; and it sends
the broker numbered frames with one missed, which the broker holds until that one arrives."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import zmq

from tests.cluster.fake_router import FakeRouter, mesh_endpoint
from tests.helpers import LEASES, Client, free_port, mesh_key


@pytest.fixture
def met(start_broker):
    """A one-worker broker and a fake router it has met: (broker, fake, the broker's incarnation)."""
    from brokerd.router.mesh_format import HELLO

    broker = start_broker("--mesh", f"127.0.0.1:{free_port()}", *LEASES, *mesh_key(), "--replication-factor", "1",
                          workers=1)
    ctx = zmq.Context()
    try:
        fake = FakeRouter(ctx, mesh_endpoint(broker.port))
        fake.read(lambda: any(k == HELLO and s == "t/w0" for k, s, _, _ in fake.frames), "the broker's HELLO")
        inc = next(i for k, s, i, _ in fake.frames if k == HELLO and s == "t/w0")
        yield broker, fake, inc
    finally:
        ctx.destroy(linger=0)


def hello(fake: FakeRouter, **extra: object) -> None:
    from brokerd.router.mesh_format import HELLO

    fake.send(HELLO, {"node": fake.node, "ipc": None, "tcp": fake.tcp, "stats": None, "peers": [], "acks": {},
                      "log": -1, **extra})


def test_a_numbered_frame_named_missed_is_sent_again_as_it_was(met):
    from brokerd.router.mesh_format import NUMBERED

    _broker, fake, inc = met
    fake.read(lambda: bool(fake.numbered), "a numbered frame (its interest, a retained sync)")
    kind, sender, seq, to, body = fake.numbered[0]
    assert kind in NUMBERED and sender == "t/w0" and to == fake.inc, "not numbered for this incarnation of the fake"
    hello(fake, missing={"t/w0": [inc, [seq]]})  # lost with a connection: named in the next HELLO
    fake.read(lambda: [n for n in fake.numbered if n[2] == seq][1:] != [], "the frame sent again")
    assert [n for n in fake.numbered if n[2] == seq] == [(kind, sender, seq, to, body)] * 2


def connected(fake: FakeRouter, port: int, client_id: str) -> Client:
    """A client connected while the fake goes on reading, saying HELLO and answering the broker's
    takeover asks for it ("not held here", unnumbered: acted on at once). Left unread, the fake
    was taken for silent during the connect now and then, and a router heard again is asked for
    its whole interest, which the fake never sends: what it announced since was not applied."""
    from brokerd.router.mesh_format import TAKEOVER_ANSWERS, TAKEOVER_ASKS, TAKEOVER_REQ, TAKEOVER_RESP

    box: dict[str, Client] = {}
    thread = threading.Thread(target=lambda: box.setdefault("client", Client(port, client_id).connect()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 15.0
    while thread.is_alive() and time.monotonic() < deadline:
        for kind, _sender, _inc, body in fake.step(50):
            if kind == TAKEOVER_REQ:
                fake.send(TAKEOVER_RESP, [body[0], None, False])
            elif kind == TAKEOVER_ASKS:
                fake.send(TAKEOVER_ANSWERS, [[ask[0], None, False] for ask in body])
    thread.join(1.0)
    assert "client" in box, f"client {client_id} not connected within 15 s"
    return box["client"]


def test_a_numbered_frame_after_a_missed_one_waits_for_it(met):
    """The fake's second interest frame arrives before its first: the broker names the first
    missed and acts on neither; once it comes, on both, in order (each asks for an
    acknowledgement, sent once it is applied; then the publishes matching the second filter reach
    the fake). The publish after waits for the acknowledgements: the client's socket and the mesh's
    are read in no set order."""
    from brokerd.router.mesh_format import HELLO, INTEREST, INTEREST_ACK

    broker, fake, inc = met
    u = uuid.uuid4().hex[:6]
    first, second = 9001, 9002  # the fake's request numbers: the broker's acknowledgements name them
    fake.send(INTEREST, [second, [[f"late{u}/#", True]]], number=(2, inc))
    fake.read(lambda: any(k == HELLO and body.get("missing", {}).get(fake.name) == [fake.inc, [1]]
                          for k, _s, _i, body in fake.frames), "the broker's HELLO naming frame 1 missed")
    pub = connected(fake, broker.port, f"p{u}")
    pub.publish(f"late{u}/x", b"held", qos=1)  # (acknowledged once routed: the filter is not applied yet)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        fake.step(50)
    assert not fake.publishes(b"held"), "the frame after the missed one acted on before it"
    assert not fake.kinds(INTEREST_ACK), "the frame after the missed one acknowledged before it came"
    fake.send(INTEREST, [first, [[f"first{u}/#", True]]], number=(1, inc))
    fake.read(lambda: len(fake.kinds(INTEREST_ACK)) >= 2, "both interest frames acknowledged")
    assert [ack[0] for ack in fake.kinds(INTEREST_ACK)] == [first, second], "not acted on in order"
    pub.publish(f"late{u}/x", b"after", qos=1)
    fake.read(lambda: bool(fake.publishes(b"after")), "the held frame's filter applied")
