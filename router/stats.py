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
    """One integer per counter, declared once: the annotations are the slots (and what mypy checks
    the ``+= 1`` against); ``limit_<name>`` for each of ``LIMITS``."""

    # state_moves: changes of session state that neither grow the log nor ask for a snapshot at once
    # (acknowledgements that end or advance a flow, released QoS 2 ids, catch-up reads): with the
    # log's end, what tells the snapshot (router.persistence) that a session may have changed.
    # auth_failures: CONNECTs refused by authentication (bad credentials, anonymous not allowed, not
    # authorized); acl_denied: PUBLISH packets and SUBSCRIBE filters refused by the ACL (or $SYS/).
    connections: int
    connects_total: int
    drop_queue_full: int
    drop_slow_consumer: int
    drop_too_large: int
    drop_mesh_backpressure: int
    drop_expired: int
    drop_mesh_peer_gone: int
    mesh_bad_frames: int
    refused_connections: int
    refused_log_unavailable: int
    protocol_errors: int
    mesh_msgs_out: int
    mesh_msgs_in: int
    mesh_bytes_out: int
    mesh_bytes_in: int
    mesh_frames_out: int
    mesh_frames_in: int
    retained_count: int
    wills_published: int
    takeovers: int
    shared_no_member: int
    unconnected: int
    auth_failures: int
    acl_denied: int
    state_moves: int
    limit_client_id: int
    limit_keepalive: int
    limit_subscriptions: int
    limit_retained: int
    limit_qos2_pending: int
    limit_qos2_expired: int
    limit_packet_timeout: int
    limit_connection_rate: int
    limit_client_rate: int
    limit_session_expiry: int
    limit_listener_connections: int

    __slots__ = tuple(__annotations__)

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)
