"""Whose a session is (``router.ownership``): the rule, its wire shapes, and the owner kept in the
takeover header and the snapshot (an older snapshot without one: an unknown owner)."""

from __future__ import annotations

import pytest

from brokerd.connection.packets import Subscription
from brokerd.router.auth import Acl, Auth
from brokerd.router.mesh_format import TAKEOVER_REQ, TAKEOVER_RESP, check_body
from brokerd.router.message import Message
from brokerd.router.ownership import REFUSE, REFUSED, REPLACE, Claim, decide, refused_by
from brokerd.router.persistence import restore_state
from brokerd.router.router import Router, RouterConfig
from tests.unit.conftest import FakeConn


@pytest.mark.parametrize(("known", "owner", "claimant", "policy", "answer"), [
    (True, "alice", "alice", REFUSE, Claim.RESUME),
    (True, None, None, REFUSE, Claim.RESUME),  # anonymous resumes anonymous
    (True, "alice", "bob", REFUSE, Claim.REFUSE),
    (True, "alice", None, REFUSE, Claim.REFUSE),
    (True, None, "bob", REFUSE, Claim.REFUSE),
    (True, "alice", "bob", REPLACE, Claim.REPLACE),
    (False, "alice", "alice", REFUSE, Claim.REPLACE),  # unknown owner: nobody resumes, nobody is locked out
    (False, None, "bob", REPLACE, Claim.REPLACE),
])
def test_a_claim_is_answered_by_the_owner_and_the_policy(known, owner, claimant, policy, answer):
    assert decide(known, owner, claimant, policy) is answer


def test_a_takeover_offer_of_another_identity_is_refused_only_when_the_claim_says_refuse():
    state = {"username": "alice"}
    assert refused_by(["bob", True], state, "t/w1") == {REFUSED: ["alice", "t/w1"]}
    assert refused_by(["alice", True], state, "t/w1") is None
    assert refused_by(["bob", False], state, "t/w1") is None  # replace: taken, then ended
    assert refused_by(None, state, "t/w1") is None
    assert refused_by(["bob", True], {}, "t/w1") is None  # unknown owner: replaced, never refused


@pytest.mark.parametrize(("body", "ok"), [
    ([1, "c"], True),
    ([1, "c", True], True),
    ([1, "c", True, ["bob", True]], True),
    ([1, "c", False, [None, False]], True),
    ([1, "c", True, ["bob"]], False),
    ([1, "c", True, [7, True]], False),
    ([1, "c", True, ["bob", 1]], False),
])
def test_a_takeover_request_carries_a_well_formed_claim(body, ok):
    assert (check_body(TAKEOVER_REQ, body) is None) is ok


@pytest.mark.parametrize(("body", "ok"), [
    ([1, None, False], True),
    ([1, None, False, ["alice"]], True),
    ([1, None, False, [None]], True),
    ([1, None, False, ["alice", "bob"]], False),
    ([1, {"client_id": "c", "persistent": True, "subs": [], "inflight": [], "queue": [], "qos2_in": []},
      False, ["alice"]], False),  # a refusal carries no session
])
def test_a_refusal_is_a_takeover_answer_without_a_session(body, ok):
    assert (check_body(TAKEOVER_RESP, body) is None) is ok


def test_the_owner_travels_with_a_session_and_an_older_state_leaves_it_unknown():
    router = Router(RouterConfig())
    s = router.new_session("c", True)
    s.username = "alice"
    router.subscribe(s, Subscription("a/#", 1))
    header = s.export_header(False)
    assert header["username"] == "alice"
    moved = Router(RouterConfig(router_id="r9")).import_session("c", s.export_state())
    assert (moved.owner_known, moved.username) == (True, "alice")
    del header["username"]  # as a build that kept no owner exported it
    header["queue"] = []
    old = Router(RouterConfig(router_id="r8")).import_session("c", header)
    assert not old.owner_known and "username" not in old.export_header(False)
    restored = router.new_session("d", True)
    restore_state(restored, {"expiry": 0})  # a snapshot session written before owners were kept
    assert not restored.owner_known
    restore_state(restored, {"expiry": 0, "username": None})
    assert restored.owner_known and restored.username is None


def test_queued_and_in_flight_messages_obey_the_acl_when_they_go_out():
    router = Router(RouterConfig())
    auth = Auth(acl=Acl.parse("user alice\ntopic read a/open\n"))
    router.acl = auth
    s = router.new_session("c", True)
    s.username = "alice"
    s.deliver_copy(Message("a/secret", b"no", qos=1), 1, False)
    s.deliver_copy(Message("a/open", b"yes", qos=1), 1, False)
    conn = FakeConn(4)
    s.attach(conn)  # type: ignore[arg-type]
    assert [p.topic for p in conn.packets()] == ["a/open"]
    s.detach()
    again = FakeConn(4)
    s.acl = Auth(acl=Acl.parse("user alice\ntopic read a/other\n"))  # revoked while unacknowledged
    s.attach(again)  # type: ignore[arg-type]
    assert again.packets() == [] and not s.inflight
