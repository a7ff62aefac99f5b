"""A router's counters: plain integers bumped in the hot path, read once a second for snapshots.

No locks and no allocation per message: the router runs on one event loop, so ``+= 1`` is safe.
"""

from __future__ import annotations

# Limits a client hit (docs/limits.md), counted as ``limit_<name>``:
# CONNECTs refused for a long client id or keepalive, SUBSCRIBE filters refused over the quota,
# retained messages delivered but not retained, connections closed for too many QoS 2 messages
# awaiting PUBREL, QoS 2 packet ids forgotten after --qos2-timeout, connections closed holding an
# unfinished packet, sockets closed over --max-connection-rate, reads paused over a client's rate,
# MQTT 5 session expiry intervals cut to --max-session-expiry, and CONNECTs refused at a
# [[listener]] table's max_connections.
LIMITS = ("client_id", "keepalive", "subscriptions", "retained", "qos2_pending", "qos2_expired",
          "packet_timeout", "connection_rate", "client_rate", "session_expiry", "listener_connections")


class RouterStats:
    # state_moves: changes of session state that neither grow the log nor ask for a snapshot at once
    # (acknowledgements that end or advance a flow, released QoS 2 ids, catch-up reads): with the
    # log's end, what tells the snapshot (router.persistence) that a session may have changed.
    # auth_failures: CONNECTs refused by authentication (bad credentials, anonymous not allowed, not
    # authorized); acl_denied: PUBLISH packets and SUBSCRIBE filters refused by the ACL (or $SYS/).
    __slots__ = (
        "connections", "connects_total",
        "drop_queue_full", "drop_slow_consumer", "drop_too_large", "drop_mesh_backpressure",
        "drop_expired", "drop_mesh_peer_gone", "mesh_bad_frames", "refused_connections", "refused_log_unavailable", "protocol_errors",
        "mesh_msgs_out", "mesh_msgs_in", "mesh_bytes_out", "mesh_bytes_in", "mesh_frames_out",
        "mesh_frames_in", "retained_count", "wills_published", "takeovers", "shared_no_member",
        "unconnected", "auth_failures", "acl_denied", "state_moves", *(f"limit_{name}" for name in LIMITS),
    )

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

