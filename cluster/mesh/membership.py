"""Membership's rules, without sockets or a clock: when a silent peer is parked or forgotten,
when this router's own loop was paused, whom a beat is echoed to, and when a silence began.

The caller (``members``, the mesh's heartbeat and HELLO handling) passes the time in
(``now``: ``time.monotonic()``, ``wall``: ``time.time()``) and acts on the answers: it parks,
forgets, logs and sends. Every rule with a timeout is unit-tested here with plain numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .peer import Peer

PARK = "park"  # alive, and silent for a mesh timeout
FORGET = "forget"  # parked for --mesh-forget


def alive(peers: dict[str, Peer]) -> set[str]:
    """The ids of the peers that count as alive now: those a request waits for."""
    return {rid for rid, p in peers.items() if p.alive}


def due(peer: Peer, now: float, timeout: float, forget: float) -> str | None:
    """What the heartbeat at ``now`` does to ``peer``: ``PARK``, ``FORGET``, or nothing."""
    if peer.alive and now - peer.last_seen > timeout:
        return PARK
    if peer.parked and now - peer.parked_at > forget:
        return FORGET
    return None


def paused_ours(gap: float, interval: float, timeout: float) -> float | None:
    """How late the heartbeat ``gap`` seconds after the last one is, when that means this
    process was not running (SIGSTOP, swapped out, a VM paused) for over half a mesh timeout:
    the silence was ours, so every peer gets a fresh timeout instead of being parked. None
    otherwise."""
    late = gap - interval
    return late if late > timeout / 2 else None


def echo_allowed(peer: Peer, inc: int, epoch: int, now: float, started: float, timeout: float) -> bool:
    """Whether a beat of ``peer``'s incarnation ``inc`` at ``epoch`` is echoed (its lease,
    ``cluster.quorum.Lease``): not where it is fenced (this router parked that incarnation at that
    epoch or a later one, and so voted it gone), nor in the first mesh timeout after this router
    started or took the peer in (met it, heard it again, a new incarnation of it): until then
    another router may still count our last HELLO without it as a vote that it is gone (our
    previous incarnation's vote, whose fence went with it, or our own before we heard it again);
    by the end of that time it has our HELLOs saying we hear it."""
    fence = peer.fence
    if fence is not None and fence[0] == inc and epoch <= fence[1]:
        return False
    return now - max(started, peer.since) >= timeout


def silent_since(peer: Peer, now: float, wall: float, timeout: float) -> float:
    """When ``peer`` fell silent, as a Unix time: a mesh timeout before it was parked here
    (``wall``, now, if it is not parked)."""
    if not peer.parked:
        return wall
    return wall - (now - peer.parked_at) - timeout


def just_parked(peers: Iterable[Peer], node_id: str, now: float, skew: float) -> list[Peer]:
    """Routers of other nodes than ``node_id`` parked less than ``skew`` ago: the other routers
    may not count them as gone yet (``limits.park_skew``)."""
    return [p for p in peers if p.parked and p.node_id != node_id and now - p.parked_at < skew]


def catchup_from(origin_mark: int, log_now: int) -> int:
    """A peer came back as a new incarnation: from where its log is read back to us (CATCHUP),
    what it acknowledged since our mark and never sent, or from where its log is now if it came
    back with less (a lost disk; -1: it has no log)."""
    return origin_mark if log_now < 0 else min(origin_mark, log_now)


def claimed_mark(peer: Peer, claim: int | None) -> int:
    """``peer``'s mark raised by its HELLO's claim that nothing of its log below ``claim`` matching
    our interest is on its way; only once the mark reached ``claim_floor`` (what a crashed
    predecessor never sent is read back first, and a claim must not jump over it)."""
    if claim is not None and peer.origin_mark >= peer.claim_floor and claim > peer.origin_mark:
        return claim
    return peer.origin_mark
