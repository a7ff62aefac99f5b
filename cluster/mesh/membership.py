"""Membership without sockets or a clock: the rules (when a silent peer is parked or forgotten,
when this router's own loop was paused, whom a beat is echoed to, when a silence began) and the
core that applies them to every peer (``MembersCore``, below).

The caller (``members``, the mesh's heartbeat and HELLO handling) passes the time in
(``now``: ``time.monotonic()``, ``wall``: ``time.time()``) and acts on the answers: it parks,
forgets, logs and sends. Every rule with a timeout is unit-tested here with plain numbers, and
the core with values and a fake ``now``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from brokerd.router.mesh_format import CATCHUP, RESYNC, SYNC_REQ

from ..quorum import MARGIN_S
from . import delivery
from .effects import Flush, Frame
from .limits import HELLO_INTERVAL_S, SYNC_WINDOW_S
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
    if claim is not None and peer.origin_mark >= peer.claim_floor and claim > peer.origin_mark \
            and not peer.missing:  # (a frame lost on the way is sent again first: ``delivery``)
        return claim
    return peer.origin_mark


# -- the membership core: state and time in, effects out ------------------------------------------
#
# ``MembersCore`` owns the transitions of every peer's membership (met, alive, parked, taken back,
# forgotten, a new incarnation) and the heartbeat's clock. Its methods take ``now`` and a frame's
# values and yield, in order, what the shell (``members.Members``) must do: frames to send and
# effects to act on (flush, log, tell the other parts, move frames between a peer's backlog and its
# link). They are generators, so that each effect is acted on before the core goes on: the order
# of the shell's actions and the core's state changes is the one a reader sees in the code (a
# peer's batch is flushed while it still counts as alive; it is parked before its new incarnation
# is recorded). A test drives the core with values and a fake ``now`` and reads the effects.
# ``Frame`` and ``Flush`` are every core's (``effects``); the others are membership's own.


class Echo(NamedTuple):
    """ECHO ``body`` to ``peer`` now, or never (a blocked link: the next beat is echoed)."""

    peer: Peer
    body: list[int]


class SendAgain(NamedTuple):
    """Our ``frames`` that ``peer`` named as missed (lost on the way: ``delivery``), sent again."""

    peer: Peer
    frames: list[bytes]


class Greet(NamedTuple):
    """HELLO on a link to ``endpoint``: a router a HELLO named that this one does not know."""

    endpoint: str


class Met(NamedTuple):
    """``peer`` is a router heard of for the first time (its record is new)."""

    peer: Peer


class Reach(NamedTuple):
    """``peer`` needs a link, to ``endpoint``."""

    peer: Peer
    endpoint: str


class Unreachable(NamedTuple):
    """``peer`` has no address this router can link to (no ``--mesh`` on its node)."""

    peer: Peer


class Parked(NamedTuple):
    """``peer`` fell silent, left or restarted (``why``): parked now."""

    peer: Peer
    why: str


class Restarted(NamedTuple):
    """``peer`` is a new incarnation: its old one's link, requests and frame numbers are gone."""

    peer: Peer


class Returning(NamedTuple):
    """``peer`` is taken back (``why``): what was kept for it goes to its link first."""

    peer: Peer
    why: str
    was_parked: bool


class Joined(NamedTuple):
    """``peer`` (re)appeared: greet it, tell the others (``first``: of its node; ``quiet``: no log line)."""

    peer: Peer
    first: bool
    quiet: bool


class Back(NamedTuple):
    """``peer`` is back after a silence (``restarted``: as a new incarnation) that began
    ``silent_for`` seconds ago (0: it was not parked)."""

    peer: Peer
    restarted: bool
    was_parked: bool
    silent_for: float


class Replay(NamedTuple):
    """This router's log is read back to ``peer`` from ``offset`` (its backlog overflowed)."""

    peer: Peer
    offset: int


class Forgotten(NamedTuple):
    """``peer`` was parked for ``--mesh-forget``: its interest and what was kept for it go."""

    peer: Peer


class OurPause(NamedTuple):
    """This router's heartbeat came ``gap`` seconds after the last, a pause the others may have
    acted on (``late``: by how much it was late, where the silence was ours; else None)."""

    gap: float
    late: float | None


class Echoed(NamedTuple):
    """``peer`` echoed this router's beat ``[epoch, n]`` (its lease's)."""

    peer: Peer
    epoch: int
    n: int


class Beat(NamedTuple):
    """The heartbeat's own work: HELLO on every link, then the next beat in ``HELLO_INTERVAL_S``."""


class MembersCore:
    """The membership of one router's peers, without sockets or a clock (see above)."""

    def __init__(self, router_id: str, node_id: str, incarnation: int, peers: dict[str, Peer],
                 timeout: float, forget: float, now: float) -> None:
        self.router_id = router_id
        self.node_id = node_id
        self.incarnation = incarnation
        self.peers = peers
        self.timeout = timeout
        self.forget = forget
        self.started = now
        self.last_beat = now
        # A heartbeat this long after the last means a pause the others may have acted on; the
        # moment that is reached, for ``check_paused``'s callers to compare with cheaply.
        self.pause_after = timeout - MARGIN_S
        self.pause_deadline = now + self.pause_after

    def heartbeat(self, now: float) -> Iterator[Any]:
        """A beat at ``now``: a pause of ours noticed, silent peers parked, long-parked ones
        forgotten, then HELLO everywhere (``Beat``)."""
        gap = now - self.last_beat  # since our last HELLO went out
        self.last_beat = now
        self.pause_deadline = now + self.pause_after
        late = paused_ours(gap, HELLO_INTERVAL_S, self.timeout)
        if gap >= self.pause_after or late is not None:
            yield OurPause(gap, late)
        if late is not None:
            for peer in self.peers.values():  # the silence was ours: a fresh timeout each
                peer.last_seen = max(peer.last_seen, now)
        for peer in list(self.peers.values()):
            step = due(peer, now, self.timeout, self.forget)
            if step is PARK:
                yield from self.park(peer, f"silent for {self.timeout:g} s", now)
            elif step is FORGET:
                peer.parked = False
                yield Forgotten(peer)
        yield Beat()

    def late(self, now: float) -> bool:
        """Whether the heartbeat is a mesh timeout late at ``now`` (this process was paused)."""
        return now >= self.pause_deadline

    def park(self, peer: Peer, why: str, now: float) -> Iterator[Any]:
        """``peer`` fell silent, left or restarted: parked, its lease fenced (no echo of ours for
        that incarnation and epoch any more)."""
        if not peer.alive:
            return
        yield Flush()  # what this tick collected for it goes first
        peer.alive = False
        peer.parked = True
        peer.parked_at = now
        if peer.incarnation is not None:
            peer.fence = (peer.incarnation, peer.beat_epoch)
        yield Parked(peer, why)

    def rejoin(self, peer: Peer, why: str, now: float) -> Iterator[Any]:
        """A parked (or forgotten) peer is heard again: the frames kept for it first, then
        interest both ways (RESYNC asks for its), then its log read back if its backlog here
        overflowed."""
        was_parked = peer.parked
        silent_for = now - peer.parked_at + self.timeout if was_parked else 0.0
        peer.parked = False
        yield Returning(peer, why, was_parked)
        if peer.link is None:
            return
        replay_from, peer.replay_from = peer.replay_from, None
        yield from self.joined(peer, now, quiet=was_parked)
        yield Back(peer, why == "restarted", was_parked, silent_for)
        yield Frame(peer, RESYNC, None)
        if replay_from is not None:
            yield Replay(peer, replay_from)

    def joined(self, peer: Peer, now: float, quiet: bool = False) -> Iterator[Any]:
        """A router (re)appeared: alive again; during this router's first ``SYNC_WINDOW_S`` its
        retained messages are asked for."""
        first = not any(p.alive for p in self.peers.values() if p.node_id == peer.node_id)
        if not peer.alive:
            peer.since = now
        peer.alive = True
        peer.left = False
        yield Joined(peer, first, quiet)
        if now - self.started < SYNC_WINDOW_S:
            # Starting up: merge the retained set of every router we meet (newest version of a
            # topic wins), so a retained update that only reached some routers before a crash of
            # the whole node comes back from any one of them.
            yield Frame(peer, SYNC_REQ, None)

    def hello(self, sender: str, inc: int, body: dict, now: float) -> Iterator[Any]:
        """A HELLO: its sender met, reached, taken back or restarted; our frames it confirms, its
        beat echoed, its mark raised, and the routers it names that we do not know greeted."""
        if sender == self.router_id:
            return
        peers = self.peers
        peer = peers.get(sender)
        if peer is None:
            peer = Peer(sender, body["node"], body.get("ipc"), body.get("tcp"))
            peers[sender] = peer
            yield Met(peer)
        peer.ipc, peer.tcp = body.get("ipc"), body.get("tcp")
        peer.stats_tcp = body.get("stats")
        peer.replicas = body.get("replicas", {})
        if peer.link is None:
            endpoint = peer.ipc if peer.node_id == self.node_id else peer.tcp
            if endpoint is None:
                yield Unreachable(peer)
                return
            yield Reach(peer, endpoint)
        peer.last_seen = now
        catchup = -1
        if peer.incarnation != inc:
            peer.claim_floor = body.get("log", -1)
            peer.interest_known = False
            if peer.incarnation is None:
                if peer.origin_mark < 0:  # first met: what it logged before is not ours to ask
                    peer.origin_mark = body.get("log", -1)
            else:
                # It crashed and came back: ask it (after our interest, below) for what it
                # acknowledged since our mark and never sent, or from where its log is now if it
                # came back with less (a lost disk). What its old incarnation had not read is
                # lost with it; what was kept for it while it was silent goes to the new one.
                catchup = catchup_from(peer.origin_mark, body.get("log", -1))
                yield from self.park(peer, "restarted", now)
                yield Restarted(peer)
            peer.incarnation = inc
            if peer.parked:
                yield from self.rejoin(peer, "restarted", now)
            else:
                yield from self.joined(peer, now)
            if catchup >= 0:
                peer.origin_mark = catchup  # raised again by its frames as it reads back
                yield Frame(peer, CATCHUP, catchup)
        elif not peer.alive:
            yield from self.rejoin(peer, "heard again", now)
        acked = body.get("acks", {}).get(self.router_id)
        if acked is not None and acked[0] == self.incarnation:
            delivery.confirmed(peer, acked[1])
        named = body.get("missing", {}).get(self.router_id)
        if named is not None and named[0] == self.incarnation:
            again = delivery.to_send_again(peer, named[1], now)
            if again:
                yield SendAgain(peer, again)
        numbered = body.get("sent", {}).get(self.router_id)
        if numbered is not None:
            delivery.sent(peer, numbered[0], numbered[1])
        peer.seen_of_me = body.get("seen", {}).get(self.router_id, -1)
        peer.hears = frozenset(p[0] for p in body.get("peers", ()))
        beat = body.get("beat")
        if beat is not None:
            yield from self.answer_beat(peer, inc, beat, now)
        peer.origin_mark = claimed_mark(peer, body.get("marks", {}).get(self.router_id))
        for rid, node, ipc, tcp in body.get("peers", ()):
            if rid != self.router_id and rid not in peers:
                endpoint = ipc if node == self.node_id else tcp
                if endpoint:
                    yield Greet(endpoint)

    def answer_beat(self, peer: Peer, inc: int, beat: list[int], now: float) -> Iterator[Any]:
        """A HELLO's beat ``[epoch, n]`` of ``peer``'s incarnation ``inc`` (its lease,
        ``cluster.quorum.Lease``), echoed at once where ``echo_allowed`` allows it."""
        peer.beat_epoch = beat[0]
        if peer.link is not None and echo_allowed(peer, inc, beat[0], now, self.started, self.timeout):
            yield Echo(peer, [inc, beat[0], beat[1]])

    def goodbye(self, peer: Peer, now: float) -> Iterator[Any]:
        """GOODBYE: the peer stops; parked, and marked as having left."""
        yield from self.park(peer, "said goodbye", now)
        peer.left = True

    def echo(self, peer: Peer, body: list) -> Iterator[Any]:
        """ECHO: a beat of this incarnation's lease answered by ``peer``."""
        if body[0] == self.incarnation:
            yield Echoed(peer, body[1], body[2])
