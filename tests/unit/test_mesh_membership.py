"""The mesh's membership rules (cluster/mesh/membership.py) with a fake clock: when a silent peer
is parked and then forgotten, when a late heartbeat means this router itself was paused, whom a
beat is echoed to, and when a silence began. Plain numbers in, decisions out."""

from __future__ import annotations

from brokerd.cluster.mesh import Peer, membership

TIMEOUT = 3.0
FORGET = 60.0


def peer(node: str = "x", **fields) -> Peer:
    p = Peer(f"{node}/w0", node, None, None)
    for name, value in fields.items():
        setattr(p, name, value)
    return p


def test_a_live_peer_is_parked_after_a_mesh_timeout_of_silence_and_forgotten_after_mesh_forget():
    p = peer(alive=True, last_seen=100.0)
    assert membership.due(p, 103.0, TIMEOUT, FORGET) is None, "silent for exactly the timeout: not yet"
    assert membership.due(p, 103.01, TIMEOUT, FORGET) is membership.PARK
    p.alive, p.parked, p.parked_at = False, True, 103.01
    assert membership.due(p, 163.0, TIMEOUT, FORGET) is None
    assert membership.due(p, 163.02, TIMEOUT, FORGET) is membership.FORGET
    p.parked = False  # forgotten (or never met): nothing more to do
    assert membership.due(p, 1000.0, TIMEOUT, FORGET) is None


def test_a_heartbeat_over_half_a_timeout_late_means_this_router_was_paused():
    assert membership.paused_ours(0.5, 0.5, TIMEOUT) is None
    assert membership.paused_ours(2.0, 0.5, TIMEOUT) is None  # 1.5 s late: half the timeout, not over
    assert membership.paused_ours(2.1, 0.5, TIMEOUT) == 2.1 - 0.5


def test_a_beat_is_echoed_only_after_a_mesh_timeout_of_hearing_the_peer_and_never_for_a_fenced_epoch():
    p = peer(since=100.0)
    started = 50.0
    assert not membership.echo_allowed(p, 7, 0, 102.0, started, TIMEOUT), "taken in less than a timeout ago"
    assert membership.echo_allowed(p, 7, 0, 103.0, started, TIMEOUT)
    assert not membership.echo_allowed(p, 7, 0, 103.0, 101.0, TIMEOUT), "this router started a moment ago"
    p.fence = (7, 2)  # parked at epoch 2 of incarnation 7
    assert not membership.echo_allowed(p, 7, 2, 200.0, started, TIMEOUT)
    assert not membership.echo_allowed(p, 7, 1, 200.0, started, TIMEOUT)
    assert membership.echo_allowed(p, 7, 3, 200.0, started, TIMEOUT), "its next epoch"
    assert membership.echo_allowed(p, 8, 0, 200.0, started, TIMEOUT), "a new incarnation"


def test_a_silence_began_a_mesh_timeout_before_the_peer_was_parked():
    p = peer(parked=True, parked_at=100.0)
    assert membership.silent_since(p, now=110.0, wall=5000.0, timeout=TIMEOUT) == 5000.0 - 10.0 - TIMEOUT
    p.parked = False
    assert membership.silent_since(p, now=110.0, wall=5000.0, timeout=TIMEOUT) == 5000.0


def test_routers_of_other_nodes_parked_within_the_skew_count_as_just_parked():
    recent = peer("y", parked=True, parked_at=99.0)
    old = peer("z", parked=True, parked_at=90.0)
    local = peer("u", parked=True, parked_at=99.5)
    alive = peer("v", alive=True)
    assert membership.just_parked([recent, old, local, alive], "u", now=100.0, skew=4.0) == [recent]


def test_a_restarted_peer_reads_back_from_our_mark_or_from_where_its_log_is_now():
    assert membership.catchup_from(500, 800) == 500
    assert membership.catchup_from(500, 200) == 200, "back with less (a lost disk)"
    assert membership.catchup_from(500, -1) == 500, "no log"


def test_a_hello_claim_raises_the_mark_only_once_the_mark_reached_the_claim_floor():
    p = peer(origin_mark=100, claim_floor=150)
    assert membership.claimed_mark(p, 200) == 100, "what a crashed predecessor never sent comes first"
    p.origin_mark = 150
    assert membership.claimed_mark(p, 200) == 200
    assert membership.claimed_mark(p, 120) == 150, "a claim never lowers the mark"
    assert membership.claimed_mark(p, None) == 150
