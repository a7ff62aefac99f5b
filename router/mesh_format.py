"""The mesh's wire format, in one home: the frame envelope and its version, the shape of each
kind's body, and the forms a message takes in a PUBLISH frame (``to_mesh`` / ``from_mesh``).

It lives in ``router/`` (which knows nothing of ZeroMQ) because both sides need it: ``cluster.mesh``
frames and sends, ``Router.deliver_forwarded`` decodes the messages of a PUBLISH frame. That loop
dispatches on the shapes named here (``PLAIN``, ``FULL``, one more for shared groups) inline,
without a call per message: it is the receiving half of every cross-router delivery.

A frame is a msgpack list ``[MESH_VERSION, kind, sender_router_id, sender_incarnation, body]``.
Every frame is checked here before the mesh acts on it: a peer that is buggy, of another build, or
lying must cost a dropped, counted frame and one log line, never an exception in the receive
callback (which would stop this router from reading the mesh at all). The bodies of PUBLISH frames
are checked message by message where they are decoded (``Router.deliver_forwarded``): a bad message
there drops only itself.

Versions, their one history (docs/design.md, docs/replication.md and CHANGELOG.md name the version
a change came with, and point here): 2 forwarded a 3.1.1 QoS 0 packet in place of topic and
payload; 3 made that form ``[packet, client id, origin offset, timestamp]``; 4 put the topic
beside the packet; 5 added QoS 1/2 heads; 6 the ``reset`` flag of a full interest announcement, the
RESYNC kind (a peer that returns after falling silent asks for everything again), and session
transfers in chunks: TAKEOVER_RESP ``[req, header, more]``, then TAKEOVER_CHUNK ``[req, items,
last]`` frames, answered by TAKEOVER_DONE ``[req, ok]`` (the old owner keeps the session until then);
and numbered PUBLISH frames, ``[seq, messages]`` per (sender, receiver), whose receipt HELLO
confirms (``acks``: {sender: last seq received}) so that frames a crashed peer never read are sent
again to its next incarnation. 7: a subscription in a session transfer carries its MQTT 5
Subscription Identifier (six values, ``Subscription.to_values``). 8: a PUBLISH frame carries a
*mark*, ``[seq, messages, mark]``: the sender's log offset below which every message of its own
that the receiver's interest matched is in this frame or an earlier one (-1: no claim, e.g. while
the sender reads its log back to that receiver); HELLO carries the sender's ``log`` offset; and
CATCHUP ``offset`` asks a restarted router to read its log back from there, by the asker's
interest: what it acknowledged and crashed before sending reaches the other routers. 9:
replication (``cluster.replication``): REPLICATE ``[partition, first, last, body, high_water]``
(``body``: the records of one log batch as the leader's log packed them), REPLICA_ACK
``[partition, offset]``, REPLICA_FETCH ``[partition, offset]``, REPLICA_CATCHUP ``[partition,
offset]`` (read your replica of that router back to me by my interest) answered by
REPLICA_PUBLISH ``[partition, messages, mark]``; HELLO carries ``replicas`` ({partition: end})
and ``marks`` ({receiver: offset}: nothing of the sender's log below it that the receiver's
interest matched is still on its way, a mark without a PUBLISH frame), and ``seen`` ({router:
offset}: how far the sender has seen each router's log; a router back on an empty disk continues
beyond). 10: sessions replicated with the log (``cluster.replication``, "Sessions" in
docs/replication.md): SESSION_STATE ``[partition, full, {client_id: state or None}]`` (a leader's
persistent sessions, as its snapshot holds them, to its followers; ``full``: these replace all
held before), SESSION_GONE ``[partition, [client_id]]`` (a session of that partition was taken over
from a replica: forget it), SESSION_CATCHUP ``[client_id, partition, start, since_ms, subs,
username, end?, spools?]`` (read your log, or your replica of ``partition``, back for that one
session: its records from ``start``, or from ``since_ms`` when ``start`` is -1, up to ``end`` when
given: the copies a lost node held outside its log; all of them when the asker ``spools`` them,
else at most ``--max-queued``) answered by SESSION_COPIES
``[client_id, items, last]`` (items as TAKEOVER_CHUNK's); SESSION_RESTORE ``partition`` (a router
back on an empty disk asks a follower of its log for its sessions) answered by SESSION_RESTORED
``[partition, header or None, last]``, one session a frame (a takeover header without copies:
its ``copies`` name the spans to read back, the replica's among them, by SESSION_CATCHUP).
11: HELLO's ``acks`` name the incarnation they confirm, ``{sender: [its incarnation, last seq]}``:
a HELLO queued for a peer that restarted meanwhile confirmed its new incarnation's frames by the
old one's numbers, so a crash of the receiver lost them. SESSION_GONE may carry a third list,
``[partition, [client_id], [client_id]]``: sessions of that partition whose delayed will was
published from its replica (not again by that router, nor by another holder). 12: INTEREST_ACK
is ``[seq, log end]``: the acknowledging router's log offset when it took the announcement in
(every message of its own from there on that the announced filters match goes to the
announcer); SESSION_HANDON ``[client_id, items]`` (items as TAKEOVER_CHUNK's): what reached a
session's old router after it was handed over, handed on to its new one (``Router.hand_on``).
13: HISTORY_FETCH ``[partition, offset, before]`` (send me the records of that log, yours or your
replica of it, from ``offset`` on and below ``before``: a follower placed at the high-water mark,
or a router back on an empty disk, fetches what lies below where its log starts) answered by
HISTORY ``[partition, first, last, body]`` (``body`` as REPLICATE's; ``first`` -1 and an empty
body: nothing more below ``before``).
14: SESSION_CATCHUP may carry ``end``: with one, the records of ``start``..``end`` whatever their
origin (the copies a session held outside its log, ``Session.copy_spans``, read back from their
origins' logs when its router is lost).
15: SESSION_HANDON is ``[client_id, items, last]``: the old router sends a last one, empty if it
has nothing to hand on, so that the new owner knows the hand-on ended; a takeover header from a
live router carries ``handon_from``, ``[Unix ms, {router: offset}]`` (where the old router stood
in each log when the session left: should it fall silent before its last SESSION_HANDON, the new
owner reads those copies back from there, ``Handons.peer_gone``).
16: the lease (``cluster.quorum.Lease``): HELLO carries ``beat``, ``[epoch, n]``, and a router
that hears it answers at once with ECHO ``[the HELLO sender's incarnation, epoch, n]``, unless it
parked that incarnation at that epoch or a later one (its fence) or has heard it for less than a
mesh timeout.
17: a session's owner (``router.ownership``): TAKEOVER_REQ may carry the asker's claim, ``[req,
client_id, spools, [user name, refuse?]]``, and a router holding another identity's session
refuses it with TAKEOVER_RESP ``[req, None, False, [owner]]``, before it lets anything go.
18: the last SESSION_HANDON may carry a fourth value, ``{router: offset}``: the routers that had
not answered the old router's barrier before it handed on, and how far it had seen their logs;
the new owner asks them for what they sent the old router before they knew of the move
(``Replication.read_back_unheard``: a link cut between them and the old router alone); a router
that answered is named there too, with None (readers before ignored such values), and the new
owner asks the routers it knows that the old router names neither way (it had not heard them:
it had just restarted) from a time (``cluster.mesh.marks.to_ask``); and a
fifth, true, on every frame of a hand-on from a copy the agreement fenced (``Router.fence_stale``):
the new owner delivers every copy, none having come to it directly.
19: a session's header (TAKEOVER_RESP, SESSION_RESTORED) names the fields it shares with a
snapshot's session as the snapshot does (``router.session_state.common_state``): ``expiry`` and
``qos2_in``, which were ``expiry_s`` and ``inbound_qos2``. A header must have ``SESSION_KEYS``
only: the QoS 2 ids, like the other fields it shares with a snapshot, may be left out.
20: PUBLISH frames lost on the way while both routers live are found and sent again
(``cluster.mesh.delivery``): a HELLO's ``sent`` gives, per peer, the lowest frame number it may
still get and the last one sent before that HELLO (-1: unsaid); its ``missing`` names, per
peer, [the incarnation that numbered them, the numbers missed]; and its ``acks`` confirm only
numbers below the first missed. A receiver of 19 confirmed the highest number received.
SESSION_COPIES may carry a fourth value, the partition its ask named: the last answer lets the
asker forget the ask, which it otherwise asks again should the asked router fall silent,
restart or come back (``CatchupPart.ask_again``).
21: a router whose session is being moved to another router (exported, not yet confirmed)
answers a takeover request for it, once that move has not settled within its wait, with
TAKEOVER_RESP ``[req, None, False, None, MOVING]``: the asker refuses its CONNECT for now (the
client retries), where "no session" had it make a new, empty one while the session stayed
with its owner (partition seed 378).
22: TAKEOVER_ASKS ``[ask, ...]``, each ask as TAKEOVER_REQ's body: the takeover requests a
router makes in one loop turn after its first (which goes at once, as TAKEOVER_REQ) travel in one
frame; the asked router answers such a frame with one TAKEOVER_ANSWERS ``[answer, ...]``, each
answer as TAKEOVER_RESP's body, sent after everything it collected while answering (one answer
alone is a TAKEOVER_RESP). An answer carrying queued copies closes its frame (its TAKEOVER_CHUNK
frames follow it), so a frame holds at most one chunk of copies (``cluster.mesh.transfer``). A
connect storm with two workers sent a frame per CONNECT each way. (Later, with the same format,
a frame also carries the asks of the turns that waited for the peer's answers to the last one,
``ACK_HOLD_S`` at most: ``cluster.mesh.takeover``'s ``_send_asks``.)
23: frames of the ``NUMBERED`` kinds are ``[MESH_VERSION, kind, sender, incarnation, body, seq,
to]``: ``seq`` in the same series as the sender's PUBLISH frames to that receiver (found missing
and sent again as they are: ``cluster.mesh.delivery``), ``to`` the receiver's incarnation it was
meant for. A receiver acts on them in their order (one that follows a missed number waits for
it), and another incarnation of it takes the number and acts only on the kinds that carry state
rather than name its requests (``SURVIVE``). Before, a frame of these kinds lost with a
connection was lost for good: a SESSION_HANDON's copies, a TAKEOVER_CHUNK's (the transfer ended
without them), an INTEREST's filter.
"""

from __future__ import annotations

from typing import Any

from brokerd.connection.codec import PUBLISH_QOS0, PUBLISH_QOS1, PUBLISH_QOS2
from brokerd.connection.reasons import ProtocolError, Reason

from .message import _QOS0_V3, _QOS0_V4, _QOS1_V3, _QOS1_V4, _QOS2_V3, _QOS2_V4, Message, _new

# Lengths of a forwarded message's forms: the plain form (a packet or head beside its topic) and
# the full one (Message.to_list()); one more value names the shared groups it was chosen for.
PLAIN, FULL = 5, 9

MESH_VERSION = 23
MOVING = "moving"  # TAKEOVER_RESP's fifth value: the session is here, being moved elsewhere (21)
(HELLO, PUBLISH, INTEREST, INTEREST_ACK, RETAINED, TAKEOVER_REQ, TAKEOVER_RESP, SYNC_REQ, GOODBYE,
 RESYNC, TAKEOVER_CHUNK, TAKEOVER_DONE, CATCHUP, REPLICATE, REPLICA_ACK, REPLICA_FETCH, REPLICA_CATCHUP,
 REPLICA_PUBLISH, SESSION_STATE, SESSION_GONE, SESSION_CATCHUP, SESSION_COPIES, SESSION_RESTORE,
 SESSION_RESTORED, SESSION_HANDON, HISTORY_FETCH, HISTORY, ECHO, TAKEOVER_ASKS, TAKEOVER_ANSWERS) = range(1, 31)
KIND_NAMES = {HELLO: "hello", PUBLISH: "publish", INTEREST: "interest", INTEREST_ACK: "interest-ack",
              RETAINED: "retained", TAKEOVER_REQ: "takeover-request", TAKEOVER_RESP: "takeover",
              SYNC_REQ: "sync-request", GOODBYE: "goodbye", RESYNC: "resync",
              TAKEOVER_CHUNK: "takeover-chunk", TAKEOVER_DONE: "takeover-done", CATCHUP: "catch-up",
              REPLICATE: "replicate", REPLICA_ACK: "replica-ack", REPLICA_FETCH: "replica-fetch",
              REPLICA_CATCHUP: "replica-catch-up", REPLICA_PUBLISH: "replica-publish",
              SESSION_STATE: "session-state", SESSION_GONE: "session-gone", SESSION_CATCHUP: "session-catch-up",
              SESSION_COPIES: "session-copies", SESSION_RESTORE: "session-restore",
              SESSION_RESTORED: "session-restored", SESSION_HANDON: "session-hand-on",
              HISTORY_FETCH: "history-fetch", HISTORY: "history", ECHO: "echo",
              TAKEOVER_ASKS: "takeover-requests", TAKEOVER_ANSWERS: "takeovers"}

# The kinds numbered per receiver (mesh version 23): found missing and sent again, acted on in
# order. The others need no number: HELLO and ECHO come again each beat, GOODBYE's loss is a
# silence, PUBLISH numbers its body, and the replication's log stream repairs its own gaps
# (REPLICATE, REPLICA_ACK and REPLICA_FETCH: ``tell_end``, a fetch asked again; HISTORY_FETCH and
# HISTORY: asked again after a wait). docs/design.md ("Frames lost with a connection") says what
# the loss of each kind cost before.
NUMBERED = frozenset((RETAINED, SYNC_REQ, CATCHUP, INTEREST, INTEREST_ACK, RESYNC, TAKEOVER_REQ,
                      TAKEOVER_RESP, TAKEOVER_ASKS, TAKEOVER_ANSWERS, TAKEOVER_CHUNK, TAKEOVER_DONE,
                      SESSION_HANDON, SESSION_GONE, SESSION_STATE, SESSION_CATCHUP, SESSION_COPIES,
                      SESSION_RESTORE, SESSION_RESTORED, REPLICA_CATCHUP, REPLICA_PUBLISH))
# Numbered kinds that another incarnation of their receiver than the one they were meant for
# (frames sent again to a receiver that restarted) still acts on: they carry state, not answers
# or asks that name the old incarnation's request numbers or work.
SURVIVE = frozenset((RETAINED, SESSION_HANDON, SESSION_GONE, SESSION_STATE))

# The largest frame a router accepts (ZeroMQ's MAXMSGSIZE on its PULL sockets; a peer sending a
# bigger one is disconnected by ZeroMQ and reconnects). Senders split publish batches well below it.
MIN_MAX_FRAME = 64 << 20

# The keys a session's header must have: those its reader (``router.session_transfer.import_state``
# and the caller's indexing) takes without a default.
SESSION_KEYS = ("client_id", "persistent", "subs", "inflight", "queue")
QUEUE_ITEM_LEN = 3  # [qos, retain, Message.to_list()]


def max_frame(max_packet_size: int) -> int:
    """The receive limit for a node whose clients may publish ``max_packet_size`` bytes."""
    return max(MIN_MAX_FRAME, 4 * max_packet_size)


def _opt_str(v: Any) -> bool:
    return v is None or v.__class__ is str


def _hello(body: Any) -> bool:
    if body.__class__ is not dict or body.get("node").__class__ is not str:
        return False
    if not (_opt_str(body.get("ipc")) and _opt_str(body.get("tcp")) and _opt_str(body.get("stats"))):
        return False
    if body.get("log", -1).__class__ is not int:
        return False
    for key in ("replicas", "marks", "seen"):
        values = body.get(key, {})
        if values.__class__ is not dict or not all(k.__class__ is str and v.__class__ is int
                                                   for k, v in values.items()):
            return False
    acks = body.get("acks", {})
    if acks.__class__ is not dict or not all(
            k.__class__ is str and v.__class__ is list and len(v) == 2 and v[0].__class__ is int
            and v[1].__class__ is int for k, v in acks.items()):
        return False
    beat = body.get("beat", [0, 0])
    if beat.__class__ is not list or len(beat) != 2 or not all(v.__class__ is int for v in beat):
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
    """[request, client id, whether the asker spools the copies (it has a log), its claim?]:
    the claim is ``[user name or None, refuse?]`` (``router.ownership``)."""
    return (body.__class__ is list and len(body) in (2, 3, 4) and body[0].__class__ is int
            and body[1].__class__ is str and (len(body) == 2 or body[2].__class__ is bool)
            and (len(body) < 4 or (body[3].__class__ is list and len(body[3]) == 2
                                   and _user(body[3][0]) and body[3][1].__class__ is bool)))


def _user(value: Any) -> bool:
    return value is None or value.__class__ is str


def _session_header(state: Any) -> bool:
    """A session as a takeover (or a restore) carries it, or None."""
    return state is None or (state.__class__ is dict and all(k in state for k in SESSION_KEYS))


def handon_from_ok(value: Any) -> bool:
    """A takeover header's ``handon_from``: ``[Unix ms, {router: offset}]``."""
    return (value.__class__ is list and len(value) == 2 and value[0].__class__ is int
            and value[1].__class__ is dict
            and all(k.__class__ is str and v.__class__ is int for k, v in value[1].items()))


def _queue_items(items: Any) -> bool:
    """Queued copies as a takeover's chunks (and a session catch-up) carry them."""
    return items.__class__ is list and all(i.__class__ is list and len(i) == QUEUE_ITEM_LEN for i in items)


def _takeover_resp(body: Any) -> bool:
    """[request, header or None, more, [owner]?, MOVING?]: with ``[owner]``, no header: the claim
    is refused; ``[request, None, False, None, MOVING]``: the session is being moved from there (21)."""
    if body.__class__ is not list or len(body) not in (3, 4, 5) or body[0].__class__ is not int:
        return False
    if len(body) == 5:
        return body[1] is None and body[2] is False and body[3] is None and body[4] == MOVING
    if len(body) == 4 and not (body[1] is None and body[3].__class__ is list and len(body[3]) == 1
                               and _user(body[3][0])):
        return False
    return body[2].__class__ is bool and _session_header(body[1])


def _takeover_asks(body: Any) -> bool:
    """One or more takeover requests, each as TAKEOVER_REQ's body."""
    return body.__class__ is list and len(body) > 0 and all(_takeover_req(ask) for ask in body)


def _takeover_answers(body: Any) -> bool:
    """One or more takeover answers, each as TAKEOVER_RESP's body."""
    return body.__class__ is list and len(body) > 0 and all(_takeover_resp(answer) for answer in body)


def _takeover_chunk(body: Any) -> bool:
    return (body.__class__ is list and len(body) == 3 and body[0].__class__ is int
            and _queue_items(body[1]) and body[2].__class__ is bool)


def _replicate(body: Any) -> bool:
    return (body.__class__ is list and len(body) == 5 and body[0].__class__ is str and body[1].__class__ is int
            and body[2].__class__ is int and 0 <= body[1] <= body[2] and body[3].__class__ is bytes
            and body[4].__class__ is int)


def _history_fetch(body: Any) -> bool:
    return (body.__class__ is list and len(body) == 3 and body[0].__class__ is str and body[1].__class__ is int
            and body[2].__class__ is int and 0 <= body[1] < body[2])


def _history(body: Any) -> bool:
    return (body.__class__ is list and len(body) == 4 and body[0].__class__ is str and body[1].__class__ is int
            and body[2].__class__ is int and body[3].__class__ is bytes
            and (0 <= body[1] <= body[2] or body[1] == body[2] == -1))


def _partition_offset(body: Any) -> bool:
    return body.__class__ is list and len(body) == 2 and body[0].__class__ is str and body[1].__class__ is int \
        and body[1] >= -1


def _replica_publish(body: Any) -> bool:
    return (body.__class__ is list and len(body) == 3 and body[0].__class__ is str
            and body[1].__class__ is list and all(m.__class__ is list and len(m) == FULL for m in body[1])
            and body[2].__class__ is int)


def _session_state(body: Any) -> bool:
    return (body.__class__ is list and len(body) == 3 and body[0].__class__ is str and body[1].__class__ is bool
            and body[2].__class__ is dict
            and all(k.__class__ is str and (v is None or v.__class__ is dict) for k, v in body[2].items()))


def _session_gone(body: Any) -> bool:
    return (body.__class__ is list and len(body) in (2, 3) and body[0].__class__ is str
            and all(ids.__class__ is list and all(c.__class__ is str for c in ids) for ids in body[1:]))


def _session_catchup(body: Any) -> bool:
    """[client id, router, start, since ms, subscriptions, user name], optionally the end and
    whether the asker spools the answers."""
    return (body.__class__ is list and 6 <= len(body) <= 8 and body[0].__class__ is str
            and body[1].__class__ is str and body[2].__class__ is int and body[3].__class__ is int
            and body[4].__class__ is list and all(s.__class__ is list for s in body[4]) and _opt_str(body[5])
            and (len(body) < 7 or body[6].__class__ is int) and (len(body) < 8 or body[7].__class__ is bool))


def _session_copies(body: Any) -> bool:
    return (body.__class__ is list and 3 <= len(body) <= 4 and body[0].__class__ is str
            and _queue_items(body[1]) and body[2].__class__ is bool
            and (len(body) == 3 or body[3].__class__ is str))


def _session_restored(body: Any) -> bool:
    return (body.__class__ is list and len(body) == 3 and body[0].__class__ is str
            and _session_header(body[1]) and body[2].__class__ is bool)


def _takeover_done(body: Any) -> bool:
    return body.__class__ is list and len(body) == 2 and body[0].__class__ is int and body[1].__class__ is bool


_CHECKS = {
    HELLO: _hello,
    PUBLISH: lambda b: (b.__class__ is list and len(b) == 3 and b[0].__class__ is int
                        and b[1].__class__ is list and b[2].__class__ is int),
    INTEREST: _interest,
    INTEREST_ACK: lambda b: (b.__class__ is list and len(b) == 2 and b[0].__class__ is int
                             and b[1].__class__ is int),
    RETAINED: lambda b: b.__class__ is list and all(t.__class__ is list for t in b),
    TAKEOVER_REQ: _takeover_req,
    TAKEOVER_RESP: _takeover_resp,
    TAKEOVER_CHUNK: _takeover_chunk,
    TAKEOVER_DONE: _takeover_done,
    TAKEOVER_ASKS: _takeover_asks,
    TAKEOVER_ANSWERS: _takeover_answers,
    SYNC_REQ: lambda b: b is None,
    GOODBYE: lambda b: b is None,
    RESYNC: lambda b: b is None,
    CATCHUP: lambda b: b.__class__ is int and b >= 0,
    REPLICATE: _replicate,
    REPLICA_ACK: _partition_offset,
    REPLICA_FETCH: _partition_offset,
    REPLICA_CATCHUP: _partition_offset,
    REPLICA_PUBLISH: _replica_publish,
    SESSION_STATE: _session_state,
    SESSION_GONE: _session_gone,
    SESSION_CATCHUP: _session_catchup,
    SESSION_COPIES: _session_copies,
    SESSION_RESTORE: lambda b: b.__class__ is str,
    SESSION_RESTORED: _session_restored,
    SESSION_HANDON: lambda b: (b.__class__ is list and 3 <= len(b) <= 5 and b[0].__class__ is str
                               and _queue_items(b[1]) and b[2].__class__ is bool
                               and (len(b) < 4 or b[3] is None or b[3].__class__ is dict)
                               and (len(b) < 5 or b[4].__class__ is bool)),
    HISTORY_FETCH: _history_fetch,
    HISTORY: _history,
    ECHO: lambda b: b.__class__ is list and len(b) == 3 and all(v.__class__ is int for v in b),
}


def check_envelope(frame: Any) -> str | None:
    """What is wrong with a decoded frame's envelope (5 values, or 7 with a number), or None."""
    n = len(frame) if frame.__class__ is list else 0
    if n != 5 and n != 7:
        return "not a 5- or 7-element list"
    if frame[1].__class__ is not int or frame[2].__class__ is not str or frame[3].__class__ is not int:
        return "bad envelope types"
    if n == 7 and not (frame[5].__class__ is int and frame[5] > 0 and frame[6].__class__ is int):
        return "bad frame number"
    return None


def check_body(kind: int, body: Any) -> str | None:
    """What is wrong with the body of a frame of ``kind``, or None."""
    check = _CHECKS.get(kind)
    if check is None:
        return f"unknown kind {kind}"
    if not check(body):
        return f"malformed {KIND_NAMES[kind]} body"
    return None


# -- a message in a PUBLISH frame ------------------------------------------------------------------

def to_mesh(self: Message) -> list:
    """The form of a forwarded message. A plain QoS 0 message (no RETAIN, no properties) whose
    MQTT 3.1.1 packet is at hand - it came so from its publisher, or a local subscriber needed
    it - travels as ``[packet, topic, client_id, origin_offset, timestamp_ms]``: the receiving
    router hands the packet to its subscribers as it is instead of encoding it again, and
    routes by the topic beside it instead of parsing the packet (parsing in Python cost more
    than msgpack spends on the topic). Its origin router is the frame's sender. A plain QoS 1
    or 2 message whose MQTT 3.1.1 head is at hand travels the same way with ``[head, payload]``
    in the packet's place, so its subscribers' head is not encoded again either. Anything
    else is ``to_list()`` (nine values)."""
    if not self.retain and self.properties is None:
        qos = self.qos
        parts = self._enc.get((4 << 3) | (qos << 1))
        if parts is not None:
            return [parts[0] if qos == 0 else [parts[0], parts[1]], self.topic, self.client_id,
                    self.origin_offset, self.timestamp_ms]
    return self.to_list()


def from_mesh(values: list, sender: str) -> Message:
    """The inverse of ``to_mesh`` for a frame from router ``sender``; raises ProtocolError on a
    packet that is not a QoS 0 PUBLISH (or a head that is not a QoS 1/2 one), ValueError or
    TypeError on values of the wrong shape.

    Once per forwarded message on the receiving router, so it fills the slots itself: the
    constructor's defaults and keyword handling cost more than the message's whole delivery
    to one subscriber. The payload stays inside the packet until asked for."""
    if len(values) != 5:
        return Message.from_list(values)
    packet, topic, client_id, origin_offset, ts = values
    if topic.__class__ is not str:
        raise TypeError("forwarded topic is not a string")
    if packet.__class__ is bytes:
        if packet[0] != PUBLISH_QOS0:
            raise ProtocolError("forwarded packet is not a QoS 0 PUBLISH", Reason.MALFORMED_PACKET)
        payload = None
        qos = 0
        parts = (packet, b"")
        enc = {_QOS0_V3: parts, _QOS0_V4: parts}  # as published() at level 4
    else:  # [head, payload]: QoS 1 or 2
        head, payload = packet
        b0 = head[0]
        if (b0 != PUBLISH_QOS1 and b0 != PUBLISH_QOS2) or payload.__class__ is not bytes:
            raise ProtocolError("forwarded head is not a QoS 1/2 PUBLISH", Reason.MALFORMED_PACKET)
        parts = (head, payload)
        if b0 == PUBLISH_QOS1:
            qos = 1
            enc = {_QOS1_V3: parts, _QOS1_V4: parts}
        else:
            qos = 2
            enc = {_QOS2_V3: parts, _QOS2_V4: parts}
    msg = _new(Message)
    msg.topic = topic
    msg._payload = payload
    msg.qos = qos
    msg.retain = False
    msg.client_id = client_id
    msg.origin_router = sender
    msg.origin_offset = origin_offset
    msg.properties = None
    msg.timestamp_ms = ts
    msg.expires_ms = 0  # no properties in this form
    msg.log_offset = -1
    msg._enc = enc
    msg._topic_bytes = None
    return msg


def to_mesh_shared(self: Message, groups: list[str], only: bool = False) -> list:
    """``to_mesh()`` plus the shared subscriptions the receiving router was chosen for, as a
    last element: 6 values for the plain QoS 0 form, 10 for the full one (``only``: the
    groups as ``{"only": groups}``, the message is for them alone). Only messages that some
    shared subscription matches pay for it; the 5-value hot form is unchanged."""
    values = to_mesh(self)
    values.append({"only": groups} if only else groups)
    return values

def from_mesh_shared(values: list, sender: str) -> tuple[Message, list[str], bool]:
    """The inverse of ``to_mesh_shared``: the message, its shared subscriptions, and whether
    it is for them alone."""
    groups = values[-1]
    only = isinstance(groups, dict)
    if only:
        groups = groups["only"]
    return from_mesh(values[:-1], sender), [str(g) for g in groups], only
