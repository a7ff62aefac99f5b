"""Delivery's rules, without sockets or a clock: PUBLISH frame numbers, the ring of frames a
peer has not confirmed, and the backlog kept for a peer that is silent.

Each rule takes a peer's record (``Peer``: the fields named in its comments) and values, and
changes that record or says what happened; the mesh (``forwarding``, ``members``) does the
sending, the logging and the counting. Numbers are per (sender, receiver): a receiver drops a
frame whose number it has seen, and a HELLO confirms up to a number once the copies its log made
are written; until then the frame stays in the sender's ring, for the receiver's next
incarnation should it crash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .limits import SEEN_WINDOW

if TYPE_CHECKING:
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
    the highest number and mark are raised), False for one received already.

    A number below the highest that is not among those seen is a frame our previous incarnation
    never read, sent again after newer ones reached us (the sender's link reconnected to us
    before it knew we had restarted): it counts."""
    seen = peer.seqs_seen
    if seq <= peer.seq_in and (seq in seen or seq <= peer.seq_in - SEEN_WINDOW):
        return False  # sent again to a new incarnation of ours, or twice: we have it
    seen[seq] = None
    if len(seen) > SEEN_WINDOW:
        del seen[next(iter(seen))]
    if seq > peer.seq_in:
        peer.seq_in = seq
    if mark > peer.origin_mark:
        peer.origin_mark = mark
    return True


def logged(peer: Peer, seq: int, end: int) -> None:
    """Frame ``seq``'s copies end at offset ``end`` of our log: confirmable once it is written."""
    unwritten = peer.unwritten
    unwritten.append((seq, end))
    if len(unwritten) > SEEN_WINDOW:  # the log stalls (a failing disk): as before,
        unwritten.popleft()  # confirmed on receipt


def confirmable(peer: Peer, written: int) -> int:
    """The number up to which ``peer``'s frames can be confirmed, our log written up to
    ``written``: received, and the copies our log made of them written. A crash loses what is
    not confirmed from the sender's ring, which sends it to our next incarnation; confirmed on
    receipt alone, a copy still in memory would be lost with the crash."""
    pending = peer.unwritten
    while pending and pending[0][1] <= written:
        pending.popleft()
    if pending:
        return min(peer.seq_in, pending[0][0] - 1)
    return peer.seq_in


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
    """``peer`` fell silent: a new backlog, from our log's offset now."""
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
    peer.seqs_seen.clear()
    peer.unwritten.clear()
    peer.resend = [frame for seq, frame in peer.ring if seq > peer.acked]
