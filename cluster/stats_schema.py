"""What a router's stats socket says: the topics, the snapshot's schema and the names in it. The
contract between the routers that publish (``cluster.stats``) and every reader (``cluster.metrics``,
``brokerd stats``), in one place both import; ``docs/stats.md`` has the operator's view.

Snapshot schema, version 1 (``v``). Counters count since the router started (they restart from 0
with a restarted worker: ``pid`` changes); rates are per second; sizes are bytes; times are seconds::

    v              1
    kind           "router"
    node           node id (--node-id)
    router         router name, "w<i>"
    router_id      "<node>/<router>", the name peers use (mesh peer keys)
    index          i
    routers        number of routers of this node (--workers): lets a reader find the others
    version        brokerd version
    pid            worker process id
    seq            snapshot number since the router started (gaps: snapshots a reader missed)
    ts             wall-clock time of the snapshot (Unix seconds, float)
    uptime         seconds since the router started
    interval       seconds between snapshots
    clients        {connected, sockets, sessions, connects_total, refused_total, protocol_errors_total}
                   connected: clients past CONNECT; sockets: open TCP connections (also those that
                   have not sent CONNECT yet); sessions: sessions held, connected or offline
    subscriptions  (filter, session) pairs on this router
    filters        distinct topic filters of local subscribers (what the router announces to peers)
    shared         {groups, members, routes, no_member_total}: shared subscriptions with local
                   members, their (member, subscription) pairs, shared subscriptions with members
                   anywhere in the cluster, and group copies that found no member here
    retained       retained messages held
    traffic        clients: {msgs_in, msgs_out, bytes_in, bytes_out}
                     PUBLISH packets from / to this router's clients (wills and $SYS excluded from
                     msgs_in) and every byte read from / written to their sockets, headers included;
                     closed connections stay counted
                   mesh: {msgs_in, msgs_out, bytes_in, bytes_out, frames_in, frames_out,
                          peers: {peer router id: {msgs_in, msgs_out, bytes_in, bytes_out}}}
                     messages forwarded to / from other routers, the bytes and the number of the
                     frames that carried them (messages per frame is how well forwarding batches);
                     only routers that exchanged traffic appear in peers
                   log: {records, bytes, read_records, read_bytes, disk_bytes}
                     commit log appends and reads; disk_bytes is the log's current size
    rates          {"1s" | "1min" | "5min" | "15min": {msgs_in, msgs_out, bytes_in, bytes_out,
                    mesh_msgs_in, mesh_msgs_out, mesh_bytes_in, mesh_bytes_out, log_records,
                    log_bytes, connects}}, per second, averaged over the window (over the uptime
                   while it is shorter)
    inflight       QoS 1/2 messages sent and not yet acknowledged, all sessions
    queued         QoS 1/2 messages waiting behind the inflight window or for an offline session
    auth           {failures_total, denied_total}: CONNECTs refused by authentication (bad user
                   name or password, anonymous not allowed, not authorized), and PUBLISH packets and
                   SUBSCRIBE filters refused by the ACL (or $SYS/)
    drops          {queue_full, too_large, slow_consumer, mesh_backpressure, mesh_peer_gone, expired, revoked}
    droppers       up to 10 sessions with the most messages dropped for them, every reason (the
                   router's counters of the reasons in ``SESSION_DROPS``): [{client_id, dropped,
                   connected, queued}], most first; empty with --stats-clients off
    sessions_dropping  sessions held that had a message dropped for them
    process        {cpu_percent, cpu_seconds, rss_bytes} of the worker process (psutil);
                   cpu_percent over the last interval, 100 = one core
    loop_lag       how late this snapshot's timer fired, seconds
    mesh_refused   {peer endpoint: why}: the peers this router cannot join (its CURVE handshake with
                   them fails: another --mesh-key); absent in a snapshot of an older brokerd
    top            up to 10 connections with the most bytes in + out: [{client_id, peer, protocol,
                   bytes_in, bytes_out, msgs_in, msgs_out, queued, inflight, dropped}]

Connection list (topic ``conns``)::

    v, kind="connections", node, router, router_id, index, ts
    total          connected clients on this router
    connections    up to 10 000 of them, most bytes first, each as in ``top``
"""

from __future__ import annotations

__all__ = ["CONNECTIONS_MAX", "DROP_REASONS", "SCHEMA_VERSION", "TOPIC_CONNECTIONS", "TOPIC_NODE",
           "TOPIC_SNAPSHOT", "TOP_N"]

SCHEMA_VERSION = 1
TOPIC_SNAPSHOT = b"snap"
TOPIC_CONNECTIONS = b"conns"
TOPIC_NODE = b"node"
TOP_N = 10  # connections in a snapshot's ``top``
CONNECTIONS_MAX = 10_000  # connections in a connection list
DROP_REASONS = ("queue_full", "too_large", "slow_consumer", "mesh_backpressure", "mesh_peer_gone", "expired",
                "revoked")
SESSION_DROPS = ("queue_full", "too_large", "slow_consumer", "expired", "revoked")
"""The reasons a message is dropped for one session, counted on it too (``Session.dropped``): when
their sum moved, the sessions are walked again for those that drop most (``droppers``)."""
DROPPERS_N = 10  # sessions in a snapshot's ``droppers``
