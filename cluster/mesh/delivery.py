"""Delivery's rules, without sockets or a clock: PUBLISH frame numbers, the ring of frames a
peer has not confirmed, and the backlog kept for a peer that is silent.

Each rule takes a peer's record (``Peer``: the fields named in its comments) and values, and
changes that record or says what happened; the mesh (``forwarding``, ``members``) does the
sending, the logging and the counting. Numbers are per (sender, receiver): a receiver drops a
frame whose number it has seen, and a HELLO confirms up to a number once the copies its log made
are written; until then the frame stays in the sender's ring, for the receiver's next
incarnation should it crash.

A frame can also be lost on its way while both ends live: ZeroMQ drops what a TCP connection
held when that connection breaks and reconnects (a firewall that rejects a node's packets for a
few seconds does it: partition seed 218 lost two frames so). So a receiver confirms only the
numbers it has *all* of (``contiguous``), names the ones it misses in its HELLO (``missing``),
and the sender sends those again from its ring (``to_send_again``); the sender's HELLO says
which numbers it has sent (``sent``: below ``base`` nothing is coming any more, up to ``last``
everything went out before that HELLO on the same socket), so a gap at the tail of a quiet
link is found too.

Frames of the other ``NUMBERED`` kinds (``router.mesh_format``: a hand-on, a session's chunk, an
interest change ...) take their numbers from the same series, stay in the same ring and are sent
again the same way. Unlike a PUBLISH frame, such a frame is acted on in order: one that follows
a missed number waits (``hold``) until that number arrives or is given up (``released``). A
resend thus never brings a session's chunk after its last one, a hand-on after the frames that
followed it, or an interest change after a later one.

A shared group's copy is for one member of its group: where the router chosen for it is
forgotten, or its backlog overflowed (what follows is read back from our log by its plain
interest alone), the QoS 1/2 group copies it never confirmed are taken out (``group_copies``)
for another router of their group.
"""

from __future__ import annotations

import itertools
from bisect import insort
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgpack

from brokerd.router.mesh_format import FULL, PLAIN, PUBLISH, from_mesh_shared

from .limits import HELD_MAX, MISSING_MAX, NAMED_MAX, RESEND_AFTER_S, UNWRITTEN_MAX

if TYPE_CHECKING:
    from brokerd.router.message import Message

    from .peer import Peer

# What ``keep`` did with a frame for a silent peer.
KEPT = "kept"  # into its backlog
TO_LOG = "to log"  # the backlog is full: this frame and all after come back from our log
DROPPED = "dropped"  # the backlog is full and there is no log to read back: counted as lost
LEFT_TO_LOG = "left to log"  # the log holds it already (the backlog filled earlier)


def unconfirmed(peer: Peer, seq: int, frame: bytes, cap: int) -> None:
    """A numbered frame handed to ``peer``'s link: kept until the peer confirms it (bounded by
    ``cap`` bytes, oldest first out: only a crash in that moment would miss them)."""
    ring = peer.ring
    ring.append((seq, frame))
    peer.ring_bytes += len(frame)
    while peer.ring_bytes > cap and ring:
        peer.ring_bytes -= len(ring.popleft()[1])


def confirmed(peer: Peer, acked: int) -> None:
    """``peer`` has received our frames up to ``acked``."""
    if acked <= peer.acked:
        return
    peer.acked = acked
    ring = peer.ring
    while ring and ring[0][0] <= acked:
        peer.ring_bytes -= len(ring.popleft()[1])


def first_receipt(peer: Peer, seq: int, mark: int) -> bool:
    """Frame ``seq`` of ``peer`` arrived carrying ``mark``: True the first time (then it counts:
    the highest number is raised, and the numbers it skipped are missed), False for one received
    already (or sent again after we stopped waiting for it).

    The mark (nothing of its log below it that our interest matched is on its way) is taken only
    while no frame is missed: with one missing, it is held until the gap is filled."""
    if seq <= peer.seq_in:
        missing = peer.missing
        if seq not in missing:
            return False  # twice, or sent again to a new incarnation of ours: we have it
        del missing[seq]
    else:
        if seq > peer.seq_in + 1:
            _miss(peer, peer.seq_in + 1, seq)
        peer.seq_in = seq
        peer.unsure = False  # (any number it skipped is missed now)
    _take_mark(peer, mark)
    return True


def _miss(peer: Peer, first: int, end: int) -> None:
    """Numbers ``[first, end)`` of ``peer`` did not come: missed, at most ``MISSING_MAX`` of them
    (beyond, the oldest are given up: the sender's ring holds less than that anyway)."""
    missing = peer.missing
    for s in range(max(first, end - MISSING_MAX), end):
        missing[s] = None
    while len(missing) > MISSING_MAX:
        del missing[next(iter(missing))]


def _take_mark(peer: Peer, mark: int) -> None:
    if peer.missing:
        if mark > peer.held_mark:
            peer.held_mark = mark
        return
    if peer.held_mark > mark:
        mark = peer.held_mark
    peer.held_mark = -1
    if mark > peer.origin_mark:
        peer.origin_mark = mark


def hold(peer: Peer, seq: int, frame: Any) -> bool:
    """Whether ``peer``'s numbered ``frame`` (received, number ``seq``) waits to be acted on: a
    lower number is missed, to be sent again. Held in number order; beyond ``HELD_MAX`` held,
    the missed numbers below the oldest are given up (a peer whose ring let them go)."""
    missing = peer.missing
    if not missing or next(iter(missing)) > seq:
        return False
    held = peer.held
    insort(held, (seq, frame), key=_number)
    if len(held) > HELD_MAX:
        _give_up(peer, held[0][0])
    return True


def released(peer: Peer, every: bool = False) -> list[Any]:
    """The held frames of ``peer`` no missed number comes before any more (``every``: all, its
    incarnation ended and the numbers it missed will not come), in order, no longer held."""
    held = peer.held
    if not held:
        return []
    first = next(iter(peer.missing), None)
    n = len(held)
    if not every and first is not None:
        n = 0
        while n < len(held) and held[n][0] < first:
            n += 1
    taken = held[:n]
    del held[:n]
    return [frame for _seq, frame in taken]


def _number(entry: tuple[int, Any]) -> int:
    return entry[0]


def _give_up(peer: Peer, below: int) -> None:
    missing = peer.missing
    while missing and next(iter(missing)) < below:
        del missing[next(iter(missing))]
    if not missing:
        _take_mark(peer, -1)


def contiguous(peer: Peer) -> int:
    """The number up to which we have every frame of ``peer``."""
    missing = peer.missing
    return next(iter(missing)) - 1 if missing else peer.seq_in


def sent(peer: Peer, base: int, last: int) -> None:
    """``peer``'s HELLO says it sends us nothing below ``base`` any more (confirmed, or its ring
    let it go: a frame lost then is lost) and, where ``last`` >= 0, sent every number up to
    ``last`` before that HELLO on the same socket: one not here by now was lost on the way."""
    if peer.seq_in < base - 1:
        peer.seq_in = base - 1  # (first met: its numbers start there for us)
    missing = peer.missing
    while missing and next(iter(missing)) < base:
        del missing[next(iter(missing))]
    if last > peer.seq_in:
        _miss(peer, peer.seq_in + 1, last + 1)
        peer.seq_in = last
    if last >= 0:
        peer.unsure = False
    if not missing:
        _take_mark(peer, -1)


def in_doubt(peer: Peer) -> bool:
    """Whether frames of ``peer`` may still reach us later than those after them: missed (sent
    again once named), or maybe lost with a connection while it was silent (``unsure``)."""
    return bool(peer.missing) or peer.unsure


def missed(peer: Peer) -> list[int]:
    """The first numbers of ``peer``'s frames we miss, to name in our HELLO (at most
    ``NAMED_MAX``; the rest next time)."""
    return list(itertools.islice(peer.missing, NAMED_MAX))


def base(peer: Peer) -> int:
    """The lowest number ``peer`` may still get from us: the oldest unconfirmed frame in the
    ring, else the oldest kept for it, else the next one."""
    low = peer.seq_out + 1
    if peer.ring:
        low = min(low, peer.ring[0][0])
    for seq, _frame in peer.backlog:
        if seq:
            return min(low, seq)
    return low


def to_send_again(peer: Peer, named: list[int], now: float) -> list[bytes]:
    """The frames of ours that ``peer`` named as missed (its HELLO), still in the ring: sent
    again, each at most once per ``RESEND_AFTER_S`` (one sent again may still be on its way
    when the next HELLO names it)."""
    if not named or not peer.ring:
        return []
    wanted = set(named)
    again = peer.resent
    frames = []
    for seq, frame in peer.ring:
        if seq in wanted and now - again.get(seq, -RESEND_AFTER_S) >= RESEND_AFTER_S:
            again[seq] = now
            frames.append(frame)
    if len(again) > 2 * NAMED_MAX:  # those confirmed since, or let go by the ring
        low = peer.ring[0][0]
        for seq in [s for s in again if s < low]:
            del again[seq]
    return frames


def logged(peer: Peer, seq: int, end: int) -> None:
    """Frame ``seq``'s copies end at offset ``end`` of our log: confirmable once it is written."""
    unwritten = peer.unwritten
    unwritten.append((seq, end))
    if len(unwritten) > UNWRITTEN_MAX:  # the log stalls (a failing disk): as before,
        unwritten.popleft()  # confirmed on receipt


def confirmable(peer: Peer, written: int) -> int:
    """The number up to which ``peer``'s frames can be confirmed, our log written up to
    ``written``: received, and the copies our log made of them written. A crash loses what is
    not confirmed from the sender's ring, which sends it to our next incarnation; confirmed on
    receipt alone, a copy still in memory would be lost with the crash."""
    pending = peer.unwritten
    while pending and pending[0][1] <= written:
        pending.popleft()
    have = contiguous(peer)
    if pending:
        return min(have, pending[0][0] - 1)
    return have


def keep(peer: Peer, frame: bytes, n: int, cap: int, log_end: int | None, log_ok: bool, seq: int = 0) -> str:
    """A frame of ``n`` messages for a silent peer: into its backlog (at most ``cap`` bytes).
    Beyond, with a working log (``log_ok``) whose offset at the last kept frame is known, the
    rest is read back from there when the peer returns; without, dropped. ``log_end``: our log's
    next offset now (None: no log). ``seq``: a PUBLISH frame's number, kept with it so that the
    frame enters the ring of unconfirmed frames when it is sent at last (0: none, or in the ring
    already)."""
    if peer.replay_from is not None:
        return LEFT_TO_LOG
    if peer.backlog_bytes + len(frame) > cap:
        if log_ok and peer.log_mark is not None:
            # Every message of this frame was logged after the mark: it and all that follows
            # come back from the log.
            peer.replay_from = peer.log_mark
            return TO_LOG
        peer.dropped += n
        return DROPPED
    peer.backlog.append((seq, frame))
    peer.backlog_bytes += len(frame)
    peer.backlog_msgs += n
    if log_end is not None:
        peer.log_mark = log_end
    return KEPT


def parked(peer: Peer, log_end: int | None) -> None:
    """``peer`` fell silent: a new backlog, from our log's offset now; and what its connection
    held may be lost, unknown to us until it numbers a frame beyond or says what it sent."""
    peer.unsure = True
    peer.dropped = 0
    peer.replay_from = None
    peer.log_mark = log_end


def take_backlog(peer: Peer) -> tuple[list[tuple[int, bytes]], int, int, int]:
    """What was kept for ``peer`` while it was silent, emptied: ((number, frame) pairs, bytes,
    messages, messages dropped)."""
    taken = peer.backlog, peer.backlog_bytes, peer.backlog_msgs, peer.dropped
    peer.backlog, peer.backlog_bytes, peer.backlog_msgs, peer.dropped = [], 0, 0, 0
    return taken


def new_incarnation(peer: Peer) -> None:
    """``peer`` restarted: its frames are numbered anew, and what its old incarnation never
    confirmed goes to the new one first (``resend``)."""
    peer.seq_in = 0
    peer.missing.clear()
    peer.held_mark = -1
    peer.unwritten.clear()
    peer.resend = [frame for seq, frame in peer.ring if seq > peer.acked]


# -- a shared group's copies for a router that does not return ----------------------------------

GroupCopy = tuple["Message", list[str]]  # a message, and the groups it was chosen for


SHARE = b"$share/"  # in every group copy's frame (its groups' keys): the rest are not unpacked


def _publish_body(frame: bytes) -> list | None:
    """A frame's body ``[seq, batch, mark]`` where it is a PUBLISH frame that may hold group
    copies; None for another kind, or one without (a frame is ``[MESH_VERSION, kind, sender,
    incarnation, body]``: ``framing``)."""
    if SHARE not in frame:
        return None  # (no group copy in it: not unpacked)
    values = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    return values[4] if values[1] == PUBLISH else None


def _split(batch: list, sender: str) -> tuple[list, list[GroupCopy]]:
    """``batch`` without its QoS 1/2 group copies (a copy that was also for the receiver's plain
    subscribers stays as a plain one), and those copies. QoS 0 copies stay: at most once, and
    the receiver may have had them already."""
    kept: list = []
    taken: list[GroupCopy] = []
    for values in batch:
        if values.__class__ is bytes or len(values) in (PLAIN, FULL):
            kept.append(values)  # (bytes: packed once for several peers, a plain copy)
            continue
        msg, groups, only = from_mesh_shared(values, sender)
        if msg.qos == 0:
            kept.append(values)
            continue
        taken.append((msg, groups))
        if not only:
            kept.append(values[:-1])
    return kept, taken


def group_copies(peer: Peer, kept: list[tuple[int, bytes]], sender: str,
                 frame: Callable[[int, Any], bytes]) -> list[GroupCopy]:
    """``peer`` is forgotten: the QoS 1/2 group copies of our PUBLISH frames it never confirmed
    (those in its ring beyond ``acked``, and those ``kept`` for it while it was silent, taken
    from its backlog already), each once, for another router of their groups. The ring's frames
    are made again without them (``frame``: ``framing._frame``), same numbers and marks: should
    the peer return after all, it is sent the rest, and no group gets a copy twice. ``sender``:
    this router (the origin of the short forms)."""
    copies: list[GroupCopy] = []
    seen: set[int] = set()
    ring: deque[tuple[int, bytes]] = deque()
    ring_bytes = 0
    for seq, data in peer.ring:
        if seq > peer.acked:
            seen.add(seq)
            body = _publish_body(data)
            if body is not None:
                batch, taken = _split(body[1], sender)
                if taken:
                    copies += taken
                    data = frame(PUBLISH, [body[0], batch, body[2]])
        ring.append((seq, data))
        ring_bytes += len(data)
    peer.ring, peer.ring_bytes = ring, ring_bytes
    for _seq, data in kept:
        body = _publish_body(data)
        # (a frame its link held when it was parked is in the ring already: number 0 here)
        if body is not None and body[0] > peer.acked and body[0] not in seen:
            seen.add(body[0])
            copies += _split(body[1], sender)[1]
    return copies


def dropped_group_copies(data: bytes, sender: str) -> list[GroupCopy]:
    """A PUBLISH frame for a parked peer that its backlog did not take (full): the QoS 1/2 group
    copies in it, for another router of their groups (what follows is read back from our log
    by the peer's plain interest alone, or dropped)."""
    body = _publish_body(data)
    return _split(body[1], sender)[1] if body is not None else []
