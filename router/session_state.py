"""A session's state as plain values, in one form: the fields every copy of a session carries,
under one name each, written by ``common_state`` and read by ``restore_common``; the two forms
that carry a session add only what is their own.

- The snapshot's (``snapshot_state`` / ``restore_state``): what ``StateStore`` writes for a
  persistent session, what a restart and the followers of its replica (cluster.replication)
  restore; it adds the log ranges, the PUBRELs to send again, the connected client's will and
  the copies held outside the log. ``snapshot_key`` says when it must be encoded again.
- The takeover's (``router.session_transfer``): what a session's move to another router carries;
  it adds the messages in flight, the queue, the next packet id and the log positions.

Before mesh version 19 the takeover named two of the common fields its own way (``expiry_s``,
``inbound_qos2``); a replica served as a takeover (cluster.replication) went through both.
The snapshot's names were kept, so ``state.msgpack`` and the replicas on disk did not change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .inflight import AWAIT_COMP, Inflight
from .message import Message, will_delay
from .ownership import state_owner

if TYPE_CHECKING:  # (``router.session`` imports ``session_transfer``, which imports this)
    from .session import Session

# The keys ``common_state`` writes (``username`` only where the owner is known).
COMMON_KEYS = ("expiry", "subs", "shared", "qos2_in", "will", "epoch", "arrived", "username")


def common_state(s: Session) -> dict:
    """The fields both forms carry: expiry, subscriptions, inbound QoS 2 ids, delayed will,
    ownership epoch, arrival and owner."""
    st = {
        "expiry": s.expiry_s,
        "subs": [x.to_values() for x in s.subscriptions.values()],
        "shared": [x.to_values() for x in s.shared.values()],
        "qos2_in": sorted(s.inbound_qos2),
        "will": s.will_state(),
        "epoch": s.epoch,
        "arrived": s.arrived_ms,
    }
    if s.owner_known:  # its owner (``router.ownership``); absent: unknown (kept by an older version)
        st["username"] = s.username
    return st


def restore_common(session: Session, st: dict) -> None:
    """``common_state``'s fields back in a session, as the copy had them; its subscriptions
    are the caller's to index (its router's tables)."""
    session.expiry_s = st.get("expiry", 0)
    session.epoch = st.get("epoch", 0)
    session.arrived_ms = st.get("arrived", 0)
    # Its owner, whom ACLs apply to after a restart too; a state without the key (written
    # before owners were kept) leaves it unknown: no identity resumes it (``router.ownership``).
    session.owner_known, session.username = state_owner(st)
    if st.get("qos2_in"):
        session.qos2_ids().update(st["qos2_in"])
    session.restore_will(st.get("will"))
    if st.get("inflight"):  # a takeover's window, which ``session_transfer.import_state`` writes in
        session.own_inflight()


def snapshot_state(s: Session, live: Message | None, log_: Any) -> dict:
    """A persistent session's state in the snapshot, but its position (``persistence._Entry``)."""
    ranges = s.range_values()
    st = common_state(s)
    st["ranges"] = ranges
    st["pubrel"] = sorted(pid for pid, e in s.inflight.items() if e.state == AWAIT_COMP)
    # The will of the connection attached now, with its Will Delay Interval: a crash closes
    # that connection without a DISCONNECT, so the will goes out after a restart (``load``),
    # or from a holder of the replicated sessions if this node is lost (cluster.replication,
    # "the wills of a silent router's sessions").
    st["live_will"] = [live.to_list(), will_delay(live)] if live is not None else None
    if s.ranges or s.queue or s.inflight:
        # Copies held outside this router's log: where their origins' logs have them
        # (read back from there if this node is lost: ``Session.copy_spans``), and those
        # in memory only, whole (delivered again after a restart: ``held_copies``).
        copies = s.copy_spans(ranges)
        if copies:
            st["copies"] = copies
        held = s.held_copies() if log_ is not None else None
        if held:
            st["held"] = held
    return st


def snapshot_key(s: Session, live: Message | None) -> tuple | None:
    """What a session's encoding (but its position) is made of, cheap to compare: equal keys,
    equal encodings (``snapshot_state``). None: encoded every time (what is in flight, queued or in ranges, and QoS 2
    ids, change without anything here to compare)."""
    if s.ranges or s.queue or s.inflight or s.inbound_qos2:
        return None
    return (s.expiry_s, tuple(s.subscriptions.values()), tuple(s.shared.values()), s.epoch, s.arrived_ms,
            s.owner_known, s.username, s.will, s.will_due_ms, live)


def restore_state(session: Session, st: dict) -> None:
    """A session's state in the snapshot's form (also what replication sends its followers),
    besides its subscriptions and position, which the caller places."""
    restore_common(session, st)
    for pid in st.get("pubrel", ()):  # PUBREL must be sent again on reconnect
        entry = Inflight(None, 2, False)
        entry.state = AWAIT_COMP
        session.own_inflight()[pid] = entry
