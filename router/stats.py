"""A router's counters: plain integers bumped in the hot path, read once a second for snapshots.

No locks and no allocation per message: the router runs on one event loop, so ``+= 1`` is safe.
"""

from __future__ import annotations


class RouterStats:
    __slots__ = (
        "msgs_in", "msgs_out", "connections", "connects_total",
        "drop_queue_full", "drop_slow_consumer", "drop_too_large", "drop_mesh_backpressure",
        "drop_expired", "drop_mesh_peer_gone", "mesh_bad_frames", "refused_connections", "refused_log_unavailable", "protocol_errors",
        "mesh_msgs_out", "mesh_msgs_in", "mesh_bytes_out", "mesh_bytes_in", "mesh_frames_out",
        "mesh_frames_in", "retained_count", "wills_published", "takeovers", "shared_no_member",
    )

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

