"""A session's old router hands it on while it misses frames of a router that answered its
barrier: frames lost on the way (ZeroMQ drops what a replaced connection held), which their
sender sends again only once this router names them, after its answer and after the hand-on;
they then match nothing here (partition seeds 331 and 341, with the links' heartbeats: 8 and 11
acknowledged messages lost). The last SESSION_HANDON names such a router with its mark, held
below the gap, so that the new owner reads its log from there.

One router's mesh, not started (``test_chaos_handon``'s): its peers, and the frames it would send."""

from __future__ import annotations

from brokerd.cluster.mesh import Mesh, Peer, delivery
from brokerd.router.mesh_format import SESSION_HANDON
from tests.unit import test_chaos_handon

mesh = test_chaos_handon.mesh  # the fixture: u/w0, which hands ``mover`` on to u/w1 (x/w0, x/w1 known too)


def _hand_on(mesh: Mesh, answered: dict) -> list:
    sent: list = []
    part = mesh.handons
    part.young_until = 0.0  # (up for a while)
    part._send = lambda peer, kind, body: sent.append((peer.router_id, kind, body))
    part.hand_on("u/w1", "mover", [], answered)
    return sent


def _lose(peer: Peer, marks: list[int]) -> None:
    """Frames 1 to len(marks) of ``peer`` carrying ``marks``; all but the first lost on the way."""
    delivery.first_receipt(peer, 1, marks[0])
    delivery.first_receipt(peer, len(marks), marks[-1])


def test_a_router_that_answered_while_its_frames_are_missed_here_is_named_with_its_held_mark(mesh):
    x0 = mesh.peers["x/w0"]
    _lose(x0, [510, 520, 530])  # frame 2 (up to 520) lost with its connection
    assert x0.missing and x0.origin_mark == 510, "the mark is held below the gap"
    sent = _hand_on(mesh, {"u/w1": 3, "x/w0": 540, "x/w1": 710})
    assert sent == [("u/w1", SESSION_HANDON, ["mover", [], True, {"x/w0": 510, "x/w1": None}])]


def test_the_new_owner_whose_frames_are_missed_here_is_named_too(mesh):
    """Its own messages sent here before the move, lost on the way: it reads them from its log."""
    _lose(mesh.peers["u/w1"], [12, 14, 16])
    sent = _hand_on(mesh, {"u/w1": 3, "x/w0": 510, "x/w1": 710})
    assert sent == [("u/w1", SESSION_HANDON, ["mover", [], True, {"u/w1": 12, "x/w0": None, "x/w1": None}])]


def test_once_the_frames_sent_again_arrived_an_answer_counts_again(mesh):
    x0 = mesh.peers["x/w0"]
    _lose(x0, [510, 520, 530])
    delivery.first_receipt(x0, 2, 520)  # sent again, before the hand-on
    sent = _hand_on(mesh, {"u/w1": 3, "x/w0": 540, "x/w1": 710})
    assert sent == [("u/w1", SESSION_HANDON, ["mover", [], True, {"x/w0": None, "x/w1": None}])]


def test_a_router_parked_here_and_back_with_no_frame_or_hello_since_is_named_with_its_mark(mesh):
    """The tail case: what x/w0's connection held before it was taken for silent may be lost,
    and no later frame or HELLO told this router yet; its answer to the barrier proves nothing."""
    x0 = mesh.peers["x/w0"]
    delivery.first_receipt(x0, 1, 510)
    delivery.parked(x0, None)
    sent = _hand_on(mesh, {"u/w1": 3, "x/w0": 540, "x/w1": 710})
    assert sent == [("u/w1", SESSION_HANDON, ["mover", [], True, {"x/w0": 510, "x/w1": None}])]
