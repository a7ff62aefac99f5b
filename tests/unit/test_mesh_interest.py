"""The mesh's interest part and its requests (cluster/mesh/interest.py, waiter.py) on their own:
an added filter waits for every live peer's acknowledgement and completes with their log ends,
a peer that falls silent counts as an answer, a request that expires names who missed it, and an
announcement received is applied and answered after what this tick collected. Fake peers and
links, a loop that never runs; no sockets. Then the core alone (``announcements``), with values."""

from __future__ import annotations

import asyncio

import pytest

from brokerd.cluster.mesh import Peer
from brokerd.cluster.mesh.announcements import (
    FULL_CHUNK,
    Acknowledge,
    Answered,
    Broadcast,
    Changed,
    InterestCore,
    Replaced,
)
from brokerd.cluster.mesh.effects import Flush, Frame
from brokerd.cluster.mesh.interest import Interest
from brokerd.cluster.mesh.waiter import Requests, Waiter
from brokerd.router.mesh_format import INTEREST, INTEREST_ACK


class FakeLink:
    def __init__(self, log: list) -> None:
        self.log = log

    def send(self, frame, sources=None) -> None:
        self.log.append(frame)


class FakeRouter:
    """What interest asks of the router, recorded in one list with the frames sent."""

    commit_log = None

    def __init__(self, log: list) -> None:
        self.log = log

    def interest_announcements(self) -> list:
        return [("a/#", True)]

    def peer_left(self, router_id: str) -> None:
        self.log.append(("left", router_id))

    def peer_interest(self, router_id: str, topic_filter: str, add: bool | int) -> None:
        self.log.append(("interest", router_id, topic_filter, add))


class Part:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.log: list = []  # frames on links (kind, body), sends ("to", router, kind, body), calls
        self.peers: dict[str, Peer] = {}
        for rid, alive in (("x/w0", True), ("y/w0", True), ("z/w0", False)):
            peer = Peer(rid, rid[0], None, None)
            peer.alive, peer.parked = alive, not alive
            peer.link = FakeLink(self.log)  # type: ignore[assignment]
            self.peers[rid] = peer
        self.requests = Requests()
        self.interest = Interest(self.loop, FakeRouter(self.log), self.peers, self.requests,  # type: ignore[arg-type]
                                 send=lambda peer, kind, body: self.log.append(("to", peer.router_id, kind, body)),
                                 mark=lambda: self.log.append("mark"),
                                 flush_collected=lambda: self.log.append("flushed"))


@pytest.fixture
def part():
    p = Part()
    yield p
    p.loop.close()


def test_an_added_filter_waits_for_every_live_peer_and_completes_with_their_log_ends(part):
    future = part.interest.announce("a/#", True)
    assert part.interest.announce("b", False) is None, "a removal waits for nobody"
    assert future is not None and part.log == ["mark", "mark"]
    part.interest.flush()
    frames = part.log[2:]
    seq = frames[0][3][0]
    assert seq is not None and frames == [("to", rid, INTEREST, [seq, [("a/#", True), ("b", False)]])
                                          for rid in ("x/w0", "y/w0")], \
        "one frame with the tick's changes, to each live peer (numbered for each) and no other"
    part.interest.on_interest_ack(part.peers["x/w0"], [seq, 10], 0)
    assert not future.done()
    part.interest.on_interest_ack(part.peers["y/w0"], [seq, 20], 0)
    assert future.done() and future.result() == {"x/w0": 10, "y/w0": 20}
    assert part.requests.get(seq) is None, "an answered request kept"


def test_a_peer_that_falls_silent_counts_as_an_answer_before_and_after_the_flush(part):
    future = part.interest.barrier()
    part.interest.peer_gone("y/w0")  # before the flush: this tick's request
    part.interest.flush()
    [seq] = {body[0] for _to, _rid, _kind, body in part.log[1:]}
    part.interest.on_interest_ack(part.peers["x/w0"], [seq, 5], 0)
    assert future.done() and future.result() == {"x/w0": 5}
    future = part.interest.barrier()
    part.interest.flush()
    seq = part.log[-1][3][0]
    part.requests.peer_gone("x/w0")  # after: the numbered request
    part.requests.peer_gone("y/w0")
    assert future.done() and future.result() == {}


def test_without_live_peers_or_once_closed_a_barrier_is_nothing_to_wait_for(part):
    for peer in part.peers.values():
        peer.alive = False
    assert part.interest.barrier() is None and part.interest.announce("a", True) is None
    part.peers["x/w0"].alive = True
    part.interest.closed = True
    assert part.interest.barrier() is None


def test_a_request_that_expires_names_the_peers_that_missed_it():
    loop = asyncio.new_event_loop()
    try:
        requests = Requests()
        waiter = Waiter(loop, {"x/w0", "y/w0"})
        req = requests.open(waiter)
        requests.answer(req, "x/w0", {"offer": 1})
        requests.expire(req, "takeover")
        assert waiter.future.done() and waiter.future.result() == {"offer": 1}
        assert waiter.missed == {"y/w0"} and requests.get(req) is None
        assert requests.open(Waiter(loop, set())) == req + 1, "numbers are one series"
    finally:
        loop.close()


def test_an_announcement_received_is_applied_and_answered_after_what_this_tick_collected(part):
    x = part.peers["x/w0"]
    part.interest.on_interest(x, [7, [["t/#", True]], True], 0)
    assert x.interest_known
    assert part.log == [("left", "x/w0"), ("interest", "x/w0", "t/#", True), "flushed",
                        ("to", "x/w0", INTEREST_ACK, [7, -1])]
    part.log.clear()
    part.interest.on_interest(x, [None, [["t/#", False]]], 0)  # not numbered: no answer
    assert part.log == [("interest", "x/w0", "t/#", False)]


# -- the core alone (cluster/mesh/announcements.py): frames in, effects out, no shell -------------


def test_the_core_turns_a_full_numbered_announcement_into_a_replacement_the_changes_a_flush_and_an_ack():
    x = Peer("x/w0", "x", None, None)
    effects = InterestCore.received(x, [7, [["t/#", True], ["$share/g/s", 2]], True])
    assert effects == [Replaced("x/w0"), Changed("x/w0", "t/#", True), Changed("x/w0", "$share/g/s", 2),
                       Flush(), Acknowledge(x, 7)]
    assert x.interest_known, "a full announcement makes the peer's interest known"


def test_the_core_applies_an_unnumbered_change_without_answering_it_nor_counting_it_as_full():
    x = Peer("x/w0", "x", None, None)
    assert InterestCore.received(x, [None, [["t/#", False]]]) == [Changed("x/w0", "t/#", False)]
    assert not x.interest_known


def test_the_core_collects_a_ticks_changes_into_one_frame_and_starts_over():
    core = InterestCore()
    core.collect("a/#", True)
    core.collect("b", False)
    assert core.out(3) == Broadcast(INTEREST, [3, [("a/#", True), ("b", False)]])
    assert core.batch == [] and core.out(None) == Broadcast(INTEREST, [None, []]), "a barrier's frame is empty"


def test_a_full_announcement_is_chunked_and_only_its_first_frame_replaces():
    x = Peer("x/w0", "x", None, None)
    changes = [(f"t/{i}", True) for i in range(FULL_CHUNK + 1)]
    frames = InterestCore.full(x, changes)
    assert [(f.kind, len(f.body[1]), f.body[2]) for f in frames] == [(INTEREST, FULL_CHUNK, True), (INTEREST, 1, False)]
    assert InterestCore.full(x, []) == [Frame(x, INTEREST, [None, [], True])], "nothing to announce still replaces"


def test_an_ack_is_an_answer_to_the_numbered_request_with_the_peers_log_end():
    assert InterestCore.acknowledged(Peer("x/w0", "x", None, None), [9, 120]) == Answered(9, "x/w0", 120)
