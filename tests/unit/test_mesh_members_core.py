"""The membership core (cluster/mesh/membership.py, ``MembersCore``) driven with values and a fake
``now``: a HELLO in, the effects and frames out, in the order the shell acts on them. No
sockets, no loop, no shell: the core's transitions alone (met, parked, taken back, restarted,
forgotten; a pause of this router's own; beats echoed or not)."""

from __future__ import annotations

from types import SimpleNamespace

from brokerd.cluster.mesh import Peer, delivery
from brokerd.cluster.mesh.effects import Flush, Frame
from brokerd.cluster.mesh.limits import HELLO_INTERVAL_S, SYNC_WINDOW_S
from brokerd.cluster.mesh.membership import (
    Back,
    Beat,
    Echo,
    Echoed,
    Forgotten,
    Greet,
    Joined,
    MembersCore,
    Met,
    OurPause,
    Parked,
    Reach,
    Replay,
    Restarted,
    Returning,
    SendAgain,
    Unreachable,
)
from brokerd.router.mesh_format import CATCHUP, RESYNC, SYNC_REQ

TIMEOUT = 3.0
FORGET = 60.0
START = 1000.0
PEER = "x/w0"


def core() -> MembersCore:
    return MembersCore("u/w0", "u", 1, {}, TIMEOUT, FORGET, START)


def hello(c: MembersCore, now: float, inc: int = 7, **body) -> list:
    """The effects of a HELLO from ``PEER``; a ``Reach`` gets its link as the shell would give it."""
    effects = []
    for effect in c.hello(PEER, inc, {"node": "x", "tcp": "tcp://x:1", "log": -1, **body}, now):
        if effect.__class__ is Reach:
            effect.peer.link = SimpleNamespace(endpoint=effect.endpoint)
        effects.append(effect)
    return effects


def kinds(effects: list) -> list:
    """Effects by class, frames by kind."""
    return [("frame", e.kind) if e.__class__ is Frame else e.__class__ for e in effects]


def test_a_router_first_heard_is_met_reached_and_joined_and_asked_for_its_retained_set():
    c = core()
    effects = hello(c, START + 1.0)
    peer = c.peers[PEER]
    assert kinds(effects) == [Met, Reach, Joined, ("frame", SYNC_REQ)]
    assert effects[1].endpoint == "tcp://x:1" and effects[2] == Joined(peer, True, False)
    assert peer.alive and peer.incarnation == 7 and peer.since == START + 1.0
    assert kinds(hello(c, START + 1.5)) == [], "a second HELLO of the same incarnation changes nothing"


def test_after_the_sync_window_a_router_met_is_not_asked_for_its_retained_set():
    c = core()
    assert ("frame", SYNC_REQ) not in kinds(hello(c, START + SYNC_WINDOW_S + 1.0))


def test_a_router_without_an_address_to_reach_is_said_so_and_not_joined():
    c = core()
    effects = list(c.hello(PEER, 7, {"node": "x", "log": -1}, START))
    assert kinds(effects) == [Met, Unreachable] and not c.peers[PEER].alive


def test_a_silent_peer_is_parked_after_the_batch_is_flushed_and_forgotten_after_mesh_forget():
    c = core()
    hello(c, START)
    peer = c.peers[PEER]
    now = START
    seen: list = []
    while now < START + TIMEOUT + 1.0:
        now += HELLO_INTERVAL_S
        seen += [e for e in c.heartbeat(now) if e.__class__ is not Beat]
    assert kinds(seen) == [Flush, Parked] and seen[1] == Parked(peer, f"silent for {TIMEOUT:g} s")
    assert peer.parked and not peer.alive and peer.fence == (7, -1)  # (no beat heard: epoch -1)
    seen = []
    while now < peer.parked_at + FORGET + 1.0:
        now += HELLO_INTERVAL_S
        seen += [e for e in c.heartbeat(now) if e.__class__ is not Beat]
    assert seen == [Forgotten(peer)] and not peer.parked


def test_a_parked_peer_heard_again_gets_its_kept_frames_then_interest_both_ways_then_its_log_read_back():
    c = core()
    hello(c, START)
    peer = c.peers[PEER]
    list(c.park(peer, "silent for the test", START + 5.0))
    peer.replay_from = 42  # its backlog overflowed meanwhile
    effects = list(c.rejoin(peer, "heard again", START + 9.0))
    assert kinds(effects) == [Returning, Joined, ("frame", SYNC_REQ), Back, ("frame", RESYNC), Replay]
    assert effects[0] == Returning(peer, "heard again", True)
    assert effects[3] == Back(peer, False, True, 9.0 - 5.0 + TIMEOUT)  # silent since a timeout before it was parked
    assert effects[5] == Replay(peer, 42) and peer.replay_from is None
    assert peer.alive and not peer.parked and peer.since == START + 9.0


def test_a_new_incarnation_parks_the_old_one_takes_the_new_one_back_and_asks_it_for_its_log():
    c = core()
    later = START + SYNC_WINDOW_S + 1.0  # (no SYNC_REQ any more)
    hello(c, later, inc=7, log=10, beat=[2, 1])
    peer = c.peers[PEER]
    peer.origin_mark = 25  # we had its messages up to here
    effects = hello(c, later + 2.0, inc=8, log=30)
    assert kinds(effects) == [Flush, Parked, Restarted, Returning, Joined, Back, ("frame", RESYNC),
                              ("frame", CATCHUP)]
    assert effects[1] == Parked(peer, "restarted") and effects[5].restarted
    assert peer.fence == (7, 2), "the old incarnation's lease is fenced, not the new one's"
    assert peer.incarnation == 8 and effects[-1].body == 25 and peer.claim_floor == 30


def test_our_own_late_heartbeat_is_a_pause_that_gives_every_peer_a_fresh_timeout():
    c = core()
    hello(c, START)
    peer = c.peers[PEER]
    late = START + TIMEOUT + 1.0
    effects = list(c.heartbeat(late))
    assert effects == [OurPause(TIMEOUT + 1.0, TIMEOUT + 1.0 - HELLO_INTERVAL_S), Beat()]
    assert peer.alive and peer.last_seen == late and c.pause_deadline > late
    assert not c.late(late) and c.late(c.pause_deadline)


def test_a_beat_is_echoed_only_after_a_mesh_timeout_of_hearing_the_peer_and_never_for_a_fenced_epoch():
    c = core()
    hello(c, START)
    peer = c.peers[PEER]
    assert list(c.answer_beat(peer, 7, [0, 1], START + 1.0)) == []
    assert list(c.answer_beat(peer, 7, [0, 2], START + TIMEOUT)) == [Echo(peer, [7, 0, 2])]
    peer.fence = (7, 0)
    assert list(c.answer_beat(peer, 7, [0, 3], START + TIMEOUT)) == []
    assert list(c.answer_beat(peer, 7, [1, 4], START + TIMEOUT)) == [Echo(peer, [7, 1, 4])]


def test_an_echo_counts_only_for_this_incarnation_and_a_goodbye_parks_the_peer_as_left():
    c = core()
    hello(c, START)
    peer = c.peers[PEER]
    assert list(c.echo(peer, [1, 0, 5])) == [Echoed(peer, 0, 5)]
    assert list(c.echo(peer, [2, 0, 5])) == []
    assert kinds(list(c.goodbye(peer, START + 1.0))) == [Flush, Parked] and peer.left and peer.parked


def test_routers_a_hello_names_that_are_unknown_here_are_greeted_and_our_frames_it_confirms_leave_the_ring():
    c = core()
    hello(c, START)
    peer = c.peers[PEER]
    peer.ring.extend([(1, b"a"), (2, b"bb")])
    peer.ring_bytes = 3
    effects = hello(c, START + 1.0, acks={"u/w0": [1, 1]},
                    peers=[["y/w0", "y", None, "tcp://y:1"], ["u/w0", "u", "ipc://me", None]])
    assert effects == [Greet("tcp://y:1")]
    assert [seq for seq, _ in peer.ring] == [2] and peer.ring_bytes == 2
    assert peer.hears == frozenset({"y/w0", "u/w0"})


def test_this_routers_own_hello_is_ignored():
    c = core()
    assert list(c.hello("u/w0", 1, {"node": "u"}, START)) == [] and c.peers == {}


def test_a_peer_is_a_plain_record_the_core_shares_with_the_mesh():
    peers: dict[str, Peer] = {}
    c = MembersCore("u/w0", "u", 1, peers, TIMEOUT, FORGET, START)
    hello(c, START)
    assert peers is c.peers and isinstance(peers[PEER], Peer)


def test_a_hello_naming_our_frames_as_missed_sends_them_again_and_its_numbers_find_a_lost_tail():
    """Frames lost on the way (``delivery``): the HELLO of the receiver names what it misses of
    ours (for this incarnation of ours, 1), and that of a sender says what it sent us."""
    c = core()
    hello(c, START + 1.0)
    peer = c.peers[PEER]
    for seq in (1, 2, 3):
        delivery.unconfirmed(peer, seq, b"f%d" % seq, cap=1000)
    peer.seq_out = 3
    effects = hello(c, START + 1.5, missing={"u/w0": [1, [2, 3]]})
    again = [e for e in effects if e.__class__ is SendAgain]
    assert len(again) == 1 and again[0].frames == [b"f2", b"f3"]
    assert not [e for e in hello(c, START + 2.0, missing={"u/w0": [0, [2]]}) if e.__class__ is SendAgain], \
        "named for another incarnation of ours: not ours to send"
    hello(c, START + 2.5, sent={"u/w0": [1, 4]})  # it sent us 1 to 4 before that HELLO: none came
    assert list(peer.missing) == [1, 2, 3, 4] and delivery.contiguous(peer) == 0
