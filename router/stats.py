"""A router's counters: plain integers bumped in the hot path, read once a second for snapshots.

No locks and no allocation per message: the router runs on one event loop, so ``+= 1`` is safe.
"""

from __future__ import annotations

from dataclasses import dataclass

# Limits a client hit (docs/limits.md), counted as ``limit_<name>``:
# CONNECTs refused for a long client id or keepalive, SUBSCRIBE filters refused over the quota,
# retained messages delivered but not retained, connections closed for too many QoS 2 messages
# awaiting PUBREL, QoS 2 packet ids forgotten after --qos2-timeout, connections closed holding an
# unfinished packet, sockets closed over --max-connection-rate, reads paused over a client's rate,
# MQTT 5 session expiry intervals cut to --max-session-expiry, and CONNECTs refused at a
# [[listener]] table's max_connections.
LIMITS = ("client_id", "keepalive", "subscriptions", "retained", "qos2_pending", "qos2_expired",
          "packet_timeout", "connection_rate", "client_rate", "session_expiry", "listener_connections")


@dataclass(slots=True, eq=False)
class RouterStats:
    """One integer per counter, declared once: a slotted dataclass, each field 0 at start (and what
    mypy checks the ``+= 1`` against); ``limit_<name>`` for each of ``LIMITS``. A dataclass, not
    ``__slots__`` from the annotations: compiled (mypyc), a native class has neither, and
    ``dataclasses.fields`` names the counters either way."""

    # state_moves: changes of session state that neither grow the log nor ask for a snapshot at once
    # (acknowledgements that end or advance a flow, released QoS 2 ids, catch-up reads): with the
    # log's end, what tells the snapshot (router.persistence) that a session may have changed.
    # auth_failures: CONNECTs refused by authentication (bad credentials, anonymous not allowed, not
    # authorized); acl_denied: PUBLISH packets and SUBSCRIBE filters refused by the ACL (or $SYS/).
    connections: int = 0
    connects_total: int = 0
    drop_queue_full: int = 0
    drop_slow_consumer: int = 0
    drop_too_large: int = 0
    drop_mesh_backpressure: int = 0
    drop_expired: int = 0
    drop_mesh_peer_gone: int = 0
    # drop_revoked: queued or in flight for a session whose identity may no longer read it (a
    # reload took the grant away). Each drop counts on its session too (``Session.dropped``).
    drop_revoked: int = 0
    mesh_bad_frames: int = 0
    refused_connections: int = 0
    refused_log_unavailable: int = 0
    protocol_errors: int = 0
    mesh_msgs_out: int = 0
    mesh_msgs_in: int = 0
    mesh_bytes_out: int = 0
    mesh_bytes_in: int = 0
    mesh_frames_out: int = 0
    mesh_frames_in: int = 0
    retained_count: int = 0
    wills_published: int = 0
    takeovers: int = 0
    shared_no_member: int = 0
    unconnected: int = 0
    auth_failures: int = 0
    acl_denied: int = 0
    state_moves: int = 0
    limit_client_id: int = 0
    limit_keepalive: int = 0
    limit_subscriptions: int = 0
    limit_retained: int = 0
    limit_qos2_pending: int = 0
    limit_qos2_expired: int = 0
    limit_packet_timeout: int = 0
    limit_connection_rate: int = 0
    limit_client_rate: int = 0
    limit_session_expiry: int = 0
    limit_listener_connections: int = 0
