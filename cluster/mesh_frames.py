"""The mesh's frame envelope and the shape of each kind's body: one home for what a peer may send.

A frame is a msgpack list ``[MESH_VERSION, kind, sender_router_id, sender_incarnation, body]``.
Every frame is checked here before the mesh acts on it: a peer that is buggy, of another build, or
lying must cost a dropped, counted frame and one log line, never an exception in the receive
callback (which would stop this router from reading the mesh at all). The bodies of PUBLISH frames
are checked message by message where they are decoded (``Router.deliver_forwarded``): a bad message
there drops only itself.

Versions: 5 added QoS 1/2 heads; 6 the ``reset`` flag of a full interest announcement, the
RESYNC kind (a peer that returns after falling silent asks for everything again), and session
transfers in chunks: TAKEOVER_RESP ``[req, header, more]``, then TAKEOVER_CHUNK ``[req, items,
last]`` frames, answered by TAKEOVER_DONE ``[req, ok]`` (the old owner keeps the session until then).
"""

from __future__ import annotations

from typing import Any

MESH_VERSION = 6
(HELLO, PUBLISH, INTEREST, INTEREST_ACK, RETAINED, TAKEOVER_REQ, TAKEOVER_RESP, SYNC_REQ, GOODBYE,
 RESYNC, TAKEOVER_CHUNK, TAKEOVER_DONE) = range(1, 13)
KIND_NAMES = {HELLO: "hello", PUBLISH: "publish", INTEREST: "interest", INTEREST_ACK: "interest-ack",
              RETAINED: "retained", TAKEOVER_REQ: "takeover-request", TAKEOVER_RESP: "takeover",
              SYNC_REQ: "sync-request", GOODBYE: "goodbye", RESYNC: "resync",
              TAKEOVER_CHUNK: "takeover-chunk", TAKEOVER_DONE: "takeover-done"}

# The largest frame a router accepts (ZeroMQ's MAXMSGSIZE on its PULL sockets; a peer sending a
# bigger one is disconnected by ZeroMQ and reconnects). Senders split publish batches well below it.
MIN_MAX_FRAME = 64 << 20

SESSION_KEYS = ("client_id", "persistent", "subs", "inflight", "queue", "inbound_qos2")
QUEUE_ITEM_LEN = 3  # [qos, retain, Message.to_list()]


def max_frame(max_packet_size: int) -> int:
    """The receive limit for a node whose clients may publish ``max_packet_size`` bytes."""
    return max(MIN_MAX_FRAME, 4 * max_packet_size)


def _opt_str(v: Any) -> bool:
    return v is None or v.__class__ is str


def _hello(body: Any) -> bool:
    if body.__class__ is not dict or body.get("node").__class__ is not str:
        return False
    if not (_opt_str(body.get("ipc")) and _opt_str(body.get("tcp"))):
        return False
    peers = body.get("peers", [])
    return peers.__class__ is list and all(
        p.__class__ is list and len(p) == 4 and p[0].__class__ is str and p[1].__class__ is str
        and _opt_str(p[2]) and _opt_str(p[3]) for p in peers)


def _interest(body: Any) -> bool:
    if body.__class__ is not list or len(body) not in (2, 3):
        return False
    seq, changes = body[0], body[1]
    if not (seq is None or seq.__class__ is int) or changes.__class__ is not list:
        return False
    if len(body) == 3 and body[2].__class__ is not bool:
        return False
    return all(c.__class__ is list and len(c) == 2 and c[0].__class__ is str
               and c[1].__class__ in (bool, int) for c in changes)


def _takeover_req(body: Any) -> bool:
    return body.__class__ is list and len(body) == 2 and body[0].__class__ is int and body[1].__class__ is str


def _takeover_resp(body: Any) -> bool:
    if body.__class__ is not list or len(body) != 3 or body[0].__class__ is not int:
        return False
    state = body[1]
    return body[2].__class__ is bool and (
        state is None or (state.__class__ is dict and all(k in state for k in SESSION_KEYS)))


def _takeover_chunk(body: Any) -> bool:
    return (body.__class__ is list and len(body) == 3 and body[0].__class__ is int
            and body[1].__class__ is list and body[2].__class__ is bool
            and all(i.__class__ is list and len(i) == QUEUE_ITEM_LEN for i in body[1]))


def _takeover_done(body: Any) -> bool:
    return body.__class__ is list and len(body) == 2 and body[0].__class__ is int and body[1].__class__ is bool


_CHECKS = {
    HELLO: _hello,
    PUBLISH: lambda b: b.__class__ is list,
    INTEREST: _interest,
    INTEREST_ACK: lambda b: b.__class__ is int,
    RETAINED: lambda b: b.__class__ is list and all(t.__class__ is list for t in b),
    TAKEOVER_REQ: _takeover_req,
    TAKEOVER_RESP: _takeover_resp,
    TAKEOVER_CHUNK: _takeover_chunk,
    TAKEOVER_DONE: _takeover_done,
    SYNC_REQ: lambda b: b is None,
    GOODBYE: lambda b: b is None,
    RESYNC: lambda b: b is None,
}


def check_envelope(frame: Any) -> str | None:
    """What is wrong with a decoded frame's envelope, or None."""
    if frame.__class__ is not list or len(frame) != 5:
        return "not a 5-element list"
    _version, kind, sender, inc, _body = frame
    if kind.__class__ is not int or sender.__class__ is not str or inc.__class__ is not int:
        return "bad envelope types"
    return None


def check_body(kind: int, body: Any) -> str | None:
    """What is wrong with the body of a frame of ``kind``, or None."""
    check = _CHECKS.get(kind)
    if check is None:
        return f"unknown kind {kind}"
    if not check(body):
        return f"malformed {KIND_NAMES[kind]} body"
    return None
