"""The session snapshot is written incrementally (``StateStore.snapshot``): what a session holds
is encoded again only when it changed, and the file reads back as one encoded whole would."""

from __future__ import annotations

import msgpack
import pytest

from brokerd.connection.packets import Subscription
from brokerd.router.clock import FakeClock
from brokerd.router.message import Message
from brokerd.router.persistence import StateStore
from brokerd.router.router import Router, RouterConfig
from tests.unit.conftest import FakeConn

pytestmark = pytest.mark.unit


def store(tmp_path):
    """A router and its store, not attached: nothing here waits for a write on a loop."""
    r = Router(RouterConfig(router_id="n/w0"), clock=FakeClock())
    st = StateStore(r, str(tmp_path))
    for i in range(20):
        s = r.new_session(f"c{i}", True)
        s.expiry_s = 60
        r.subscribe(s, Subscription(f"d/{i}", 1))
    return r, st


def sessions(data: bytes) -> dict:
    return msgpack.unpackb(data, strict_map_key=False)["sessions"]


def test_every_change_to_a_session_is_in_the_next_snapshot(tmp_path):
    r, st = store(tmp_path)
    first = sessions(st.snapshot())
    assert sorted(first) == sorted(f"c{i}" for i in range(20))
    assert first["c3"]["subs"] == [list(Subscription("d/3", 1).to_values())] and first["c3"]["expiry"] == 60
    s1, s2, s3, s4, s5 = (r.sessions[f"c{i}"] for i in range(1, 6))
    r.subscribe(s1, Subscription("d/1", 0))  # the same filter at another QoS
    s2.expiry_s = 7
    r.delay_will(s3, Message("w/3", b"bye", client_id="c3"), 30)
    s4.qos2_ids().add(9)
    s5.deliver(Message("d/5", b"queued", qos=1), 1, False)  # offline: queued (encoded every time)
    r.end_session(r.sessions["c6"])
    again = sessions(st.snapshot())
    assert again["c1"]["subs"] == [list(Subscription("d/1", 0).to_values())]
    assert again["c2"]["expiry"] == 7
    assert again["c3"]["will"][0][0] == "w/3"
    assert again["c4"]["qos2_in"] == [9]
    assert again["c5"]["subs"] == first["c5"]["subs"]
    assert "c6" not in again
    assert again["c7"] == first["c7"]  # unchanged


def test_a_session_replaced_by_a_new_one_of_its_id_is_encoded_anew(tmp_path):
    r, st = store(tmp_path)
    st.snapshot()
    r.drop_session(r.sessions["c0"])
    s = r.new_session("c0", True)
    r.subscribe(s, Subscription("other", 2))
    assert sessions(st.snapshot())["c0"]["subs"] == [list(Subscription("other", 2).to_values())]


def test_the_will_of_a_connected_client_is_kept_as_it_changes(tmp_path):
    r, st = store(tmp_path)
    s = r.sessions["c8"]
    conn = FakeConn()
    s.attach(conn)  # type: ignore[arg-type]
    client = type("C", (), {})()
    client.session, client.will = s, Message("w/8", b"x", client_id="c8")
    r.clients["c8"] = client  # type: ignore[assignment]
    assert sessions(st.snapshot())["c8"]["live_will"][0][0] == "w/8"
    client.will = None  # a DISCONNECT without its will
    assert sessions(st.snapshot())["c8"]["live_will"] is None


def test_a_snapshot_reads_back_as_the_state_it_was_made_of(tmp_path):
    r, st = store(tmp_path)
    r.delay_will(r.sessions["c2"], Message("w/2", b"bye", client_id="c2"), 30)
    st.snapshot()
    st.write_now()  # the second write reuses what the first encoded
    again = Router(RouterConfig(router_id="n/w0"), clock=FakeClock())
    loaded = StateStore(again, str(tmp_path))
    assert loaded.load() == (20, 0)
    assert sorted(again.sessions) == sorted(r.sessions)
    assert list(again.sessions["c4"].subscriptions) == ["d/4"] and again.sessions["c4"].expiry_s == 60
    assert again.sessions["c2"].will is not None and again.sessions["c2"].will.topic == "w/2"


def test_replication_is_given_the_same_state_for_an_unchanged_session(tmp_path):
    r, st = store(tmp_path)
    given: list[dict] = []
    r.replication = type("R", (), {"sessions_changed": lambda self, s: given.append(s)})()
    st.snapshot()
    r.sessions["c1"].expiry_s = 5
    st.snapshot()
    first, second = given
    assert second["c0"] is first["c0"] and second["c1"] is not first["c1"]
    assert second["c1"]["expiry"] == 5 and "position" in second["c1"]
