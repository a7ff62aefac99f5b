"""The mesh's intervals and bounds, and the logger every part of it writes to.

Every module of the package logs as ``brokerd.cluster.mesh``: one logger for the mesh, whatever
part of it speaks, so that a line reads (and is filtered) the same wherever its code lives.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..config import Config

log = logging.getLogger("brokerd.cluster.mesh")

HELLO_INTERVAL_S = 0.5
ACK_TIMEOUT_S = 2.0
# A takeover's asks to a peer that has not answered the frame it has wait this long at most for
# that answer, to go together (``Takeovers._send_asks``): a round trip between two loaded workers.
ACK_HOLD_S = 0.002
MAX_PENDING_FRAMES = 100_000  # per blocked peer, for frames with no connection to pause (wills ...)
RECV_BATCH = 512  # frames handled per readable callback at most
RECV_MSGS = 128  # forwarded messages after which the rest waits for the next loop iteration
LINGER_BELOW = 64  # publishes in a tick's frames below which they wait one more loop iteration
SYNC_WINDOW_S = 30.0  # after start, fetch the retained messages of every router that joins
MOVE_TIMEOUT_S = 60.0  # an exported session not confirmed by its new owner within this stays here
LOCAL_DOWN_WAIT_S = 5.0  # a CONNECT waits this long for a router of this node that is down
# PUBLISH frames lost on the way (``delivery``): numbers missed per peer at most, named in one
# HELLO at most, and how soon one sent again is sent again once more if still named.
MISSING_MAX = 65536
NAMED_MAX = 256
RESEND_AFTER_S = 1.0
HELD_MAX = 4096  # numbered frames of a peer held behind a missed one at most (``delivery.hold``)
UNWRITTEN_MAX = 4096  # received frames whose copies our log has not written, remembered per peer
# A session taken over from a live router is confirmed (TAKEOVER_DONE) once the interest its
# subscriptions announced is acknowledged; at the latest this long after it arrived.
CONFIRM_S = 10.0  # (beyond the interest waits and a snapshot write: router.connecting DURABLE_WAIT_S)
HANDON_KEEP_S = 30.0  # how long the marks that filter a moved session's handed-on copies are kept
HANDON_ITEMS = 1000  # copies per SESSION_HANDON frame
# A router this young (restarted since) has every router read back what it sent there, from a
# time, when a session moves off it: the others' frames to its new incarnation may come late.
HANDON_YOUNG_S = 10.0
# CURVE handshake failures logged only once they go on this long (a restart fails one or two) ...
CURVE_PERSIST_S = 3.0
CURVE_STREAK_GAP_S = 5.0  # ... with no pause longer than this between them (ZeroMQ retries each second at most)


def park_skew(config: Config) -> float:
    """How long after a router is parked here the others may still count it as alive: each
    notices a silence by its own clock, and one that got its GOODBYE (a stop, or a dying node that
    managed to say it to some) parks it a whole mesh timeout before the others. Also how long a
    router back from a death holds its overdue delayed wills (cluster.worker): the same window in
    which a replica's notice that it published them arrives."""
    return config.mesh_timeout + 1.0


def drop_older(entries: dict, horizon: float, when: Callable[[Any], float]) -> None:
    """Drop the entries of ``entries`` (insertion-ordered, oldest first) from before ``horizon``:
    the cost is the entries dropped, not the dict's size."""
    while entries:
        first = next(iter(entries))
        if when(entries[first]) >= horizon:
            return
        del entries[first]
