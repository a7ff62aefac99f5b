"""A persistent session in the snapshot's form: what ``StateStore`` writes for it, what a
restart and the followers of its replica (cluster.replication) restore from it, and the key
that says when it must be encoded again. One home for the form's key names.

(A takeover between routers carries a session in another form, ``Session.export_header`` /
``import_state``, with its own names: both are on disks and wires of running clusters.)
"""

from __future__ import annotations

from typing import Any

from .inflight import AWAIT_COMP, Inflight
from .message import Message, will_delay
from .ownership import state_owner
from .session import Session


def snapshot_state(s: Session, live: Message | None, log_: Any) -> dict:
    """A persistent session's state in the snapshot, but its position (``persistence._Entry``)."""
    ranges = s.range_values()
    st = {
        "expiry": s.expiry_s,
        "subs": [x.to_values() for x in s.subscriptions.values()],
        "shared": [x.to_values() for x in s.shared.values()],
        "ranges": ranges,
        "qos2_in": sorted(s.inbound_qos2),
        "pubrel": sorted(pid for pid, e in s.inflight.items() if e.state == 1),
        "will": s.will_state(),
        # The will of the connection attached now, with its Will Delay Interval: a crash
        # closes that connection without a DISCONNECT, so the will goes out after a
        # restart (``load``), or from a holder of the replicated sessions if this node
        # is lost (cluster.replication, "the wills of a silent router's sessions").
        "live_will": [live.to_list(), will_delay(live)] if live is not None else None,
        "epoch": s.epoch,
        "arrived": s.arrived_ms,
    }
    if s.owner_known:  # its owner (``router.ownership``); ACLs apply to it after a restart too
        st["username"] = s.username
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
    session.expiry_s = st.get("expiry", 0)
    session.epoch = st.get("epoch", 0)
    session.arrived_ms = st.get("arrived", 0)
    # Its owner, whom ACLs apply to after a restart too; a snapshot without the key (written
    # before owners were kept) leaves it unknown: no identity resumes it (``router.ownership``).
    session.owner_known, session.username = state_owner(st)
    if st.get("qos2_in"):
        session.qos2_ids().update(st["qos2_in"])
    for pid in st.get("pubrel", ()):  # PUBREL must be sent again on reconnect
        entry = Inflight(None, 2, False)
        entry.state = AWAIT_COMP
        session.inflight[pid] = entry
    session.restore_will(st.get("will"))
