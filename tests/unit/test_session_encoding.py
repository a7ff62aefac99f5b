"""A session as plain values has one form (``router.session_state``): the fields every copy of a
session carries, under one name each, which the snapshot and the takeover extend with their own.
Each form reads back what it wrote; what disks hold today (a snapshot of version 2, a follower's
replica) is read; a takeover from a peer of the previous mesh version is refused, not misread."""

from __future__ import annotations

import msgpack
import pytest

from brokerd.cluster.mesh import dispatch
from brokerd.connection.packets import Subscription
from brokerd.router.clock import FakeClock
from brokerd.router.inflight import AWAIT_ACK, AWAIT_COMP, Inflight
from brokerd.router.mesh_format import MESH_VERSION, SESSION_KEYS, TAKEOVER_RESP
from brokerd.router.message import Message
from brokerd.router.persistence import SNAPSHOT, SNAPSHOT_VERSION, StateStore
from brokerd.router.router import Router, RouterConfig
from brokerd.router.session import Session
from brokerd.router.session_state import COMMON_KEYS, common_state, restore_state, snapshot_state

pytestmark = pytest.mark.unit

SNAPSHOT_OWN = {"ranges", "pubrel", "live_will"}  # (and ``copies``, ``held`` where it holds copies)
TAKEOVER_OWN = {"client_id", "persistent", "inflight", "queue", "log", "next_pid"}

# ``state.msgpack`` as the previous version wrote it (SNAPSHOT_VERSION 2, before issue 42): one
# persistent session with every field both forms carry, and a PUBREL to send again.
SNAPSHOT_V2 = (
    b"\x87\xa7version\x02\xa6router\xa4n/w0\xaalog_offset\x00\xa8sessions\x81\xa3dev\x8c\xa6expiry"
    b"\xcd\x01,\xa4subs\x91\x96\xa3a/#\x01\xc2\xc2\x00\x00\xa6shared\x91\x96\xac$share/g/b/+\x02\xc2"
    b"\xc2\x00\x00\xa6ranges\x90\xa7qos2_in\x92\x04\x07\xa6pubrel\x91\x05\xa4will\x92\x99\xa5w/dev"
    b"\xc4\x04gone\x01\xc2\xa3dev\xa0\xff\xc0\xcf\x00\x00\x01\x8b\xcf\xe5h\x00\xcf\x00\x00\x01\x8b"
    b"\xcf\xe6R`\xa9live_will\xc0\xa5epoch\x03\xa7arrived\xcf\x00\x00\x01\x8b\xcf\xe5h\x00\xa8username"
    b"\xa5alice\xa8position\xc0\xa8retained\x90\xa6fenced\x80\xacfenced_wills\x80"
)

# A session's header as mesh version 18 sent it (TAKEOVER_RESP): two of the common fields under
# names of their own.
HEADER_V18 = {"client_id": "dev", "persistent": True, "expiry_s": 300, "subs": [["a/#", 1, False, False, 0, 0]],
              "inflight": [], "queue": [], "log": [], "inbound_qos2": [4, 7], "next_pid": 1, "shared": [],
              "will": None, "epoch": 3, "arrived": 1_700_000_000_000, "username": "alice"}


def router(name: str = "n/w0") -> Router:
    return Router(RouterConfig(router_id=name, verifies_identities=True), clock=FakeClock())


def full_session(r: Router) -> Session:
    """A persistent session holding something in every field either form carries."""
    s = r.new_session("dev", True)
    s.expiry_s = 300
    s.username = "alice"
    s.epoch = 3
    s.arrived_ms = 1_699_999_000_000
    r.subscribe(s, Subscription("a/#", 1))
    r.subscribe_shared(s, Subscription("$share/g/b/+", 2))
    s.qos2_ids().update({7, 4})
    s.will = Message("w/dev", b"gone", qos=1, client_id="dev", timestamp_ms=1_700_000_000_000)
    s.will_due_ms = 1_700_000_060_000
    return s


def with_pubrel(s: Session, pid: int = 5) -> Session:
    entry = Inflight(None, 2, False)
    entry.state = AWAIT_COMP
    s.own_inflight()[pid] = entry
    return s


def plain(values: object) -> object:
    """As the other end reads it (msgpack: tuples become lists)."""
    return msgpack.unpackb(msgpack.packb(values, use_bin_type=True), raw=False, strict_map_key=False)


def placed(st: dict) -> Session:
    """A session restored from the snapshot's form, its subscriptions placed as a caller does."""
    s = router().new_session("dev", True)
    restore_state(s, st)
    for table, values in ((s.own_subscriptions, st["subs"]), (s.own_shared, st["shared"])):
        for v in values:
            sub = Subscription.from_values(v)
            table()[sub.topic_filter] = sub
    return s


def test_both_forms_carry_the_common_fields_under_one_name_each():
    s = with_pubrel(full_session(router()))
    common = common_state(s)
    assert set(common) == set(COMMON_KEYS)
    snapshot = snapshot_state(s, None, None)
    header = s.export_header(False)
    assert {k: snapshot[k] for k in COMMON_KEYS} == common == {k: header[k] for k in COMMON_KEYS}
    assert set(snapshot) == set(COMMON_KEYS) | SNAPSHOT_OWN
    assert set(header) == set(COMMON_KEYS) | TAKEOVER_OWN
    assert set(SESSION_KEYS) <= set(header)
    assert not {"expiry_s", "inbound_qos2"} & (set(snapshot) | set(header))  # the names that drifted


def test_a_session_in_the_snapshot_form_reads_back_as_it_was_written():
    s = with_pubrel(full_session(router()))
    st = plain(snapshot_state(s, None, None))
    back = placed(st)
    assert plain(snapshot_state(back, None, None)) == st
    assert (back.expiry_s, back.epoch, back.arrived_ms, back.owner_known, back.username) == (
        300, 3, 1_699_999_000_000, True, "alice")
    assert set(back.inbound_qos2) == {4, 7} and back.inflight[5].state == AWAIT_COMP
    assert (back.will.topic, back.will_due_ms) == ("w/dev", 1_700_000_060_000)


def test_a_moved_session_reads_back_as_it_was_written_one_epoch_on():
    s = full_session(router())
    sent = Inflight(Message("a/1", b"in flight", qos=1, timestamp_ms=1_700_000_000_000), 1, False)
    sent.state = AWAIT_ACK
    s.own_inflight()[9] = sent
    s.next_pid = 10
    s.deliver(Message("a/2", b"queued", qos=1, timestamp_ms=1_700_000_000_000), 1, False)
    state = plain(s.export_state())
    assert [item[2][1] for item in state["queue"]] == [b"queued"]
    other = router("m/w0")
    moved = other.import_session("dev", state)
    again = plain(moved.export_state())
    assert again["epoch"] == 4  # one more at every move (``recency``) ...
    assert again["arrived"] == int(other.clock.unix() * 1000)  # ... and arrived there now
    assert {**again, "epoch": 3, "arrived": state["arrived"]} == state
    assert moved.inflight[9].msg.payload == b"in flight" and moved.next_pid == 10


def test_a_snapshot_written_by_the_previous_version_is_read(tmp_path):
    assert msgpack.unpackb(SNAPSHOT_V2)["version"] == SNAPSHOT_VERSION == 2  # the form did not change
    (tmp_path / SNAPSHOT).write_bytes(SNAPSHOT_V2)
    r = router()
    assert StateStore(r, str(tmp_path)).load() == (1, 0)
    s = r.sessions["dev"]
    assert (s.expiry_s, s.epoch, s.arrived_ms, s.owner_known, s.username) == (
        300, 3, 1_700_000_000_000, True, "alice")
    assert list(s.subscriptions) == ["a/#"] and list(s.shared) == ["$share/g/b/+"]
    assert set(s.inbound_qos2) == {4, 7} and s.inflight[5].state == AWAIT_COMP
    assert (s.will.topic, s.will.payload, s.will_due_ms) == ("w/dev", b"gone", 1_700_000_060_000)


def test_a_replica_held_by_a_follower_is_handed_over_with_the_fields_it_holds():
    """A follower holds a session in the snapshot's form (``sessions.msgpack``, as SESSION_STATE
    brought it) and serves it as a takeover's header (``cluster.replication``, through a
    ``Session``): the fields they share keep their values and their names."""
    held = {**msgpack.unpackb(SNAPSHOT_V2)["sessions"]["dev"], "position": 0}
    header = plain(placed(held).export_header(False))
    assert {k: header[k] for k in COMMON_KEYS} == {k: held[k] for k in COMMON_KEYS}
    assert header["expiry"] == 300 and header["qos2_in"] == [4, 7]


def test_a_takeover_from_a_peer_of_the_previous_mesh_version_is_refused_not_misread():
    """Mesh versions must match (``dispatch.read``): a version 18 header, with its own names for
    the expiry and the QoS 2 ids, is never read as this version's."""
    def frame(version: int, header: dict) -> bytes:
        return msgpack.packb([version, TAKEOVER_RESP, "old/w0", 1, [1, header, False]], use_bin_type=True)

    refused = dispatch.read(frame(18, HEADER_V18))
    assert isinstance(refused, dispatch.Refused) and refused.version == 18 and MESH_VERSION >= 19
    header = plain(full_session(router()).export_header(False))
    assert dispatch.read(frame(MESH_VERSION, header)) == (TAKEOVER_RESP, "old/w0", 1, [1, header, False], 0, 0)
