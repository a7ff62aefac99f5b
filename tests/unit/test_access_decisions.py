"""router.access as decisions: each CONNECT check returns a value (allowed, refused with a
reason, anonymous, pending on a plugin) and writes nothing to the client."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from brokerd.connection.listener import Listener
from brokerd.connection.packets import MQTT_5, Connect, Publish, Will
from brokerd.connection.reasons import Reason
from brokerd.router.access import ALLOWED, ANONYMOUS, anonymous_check, decided, plugin_reason, publish_refusal
from brokerd.router.auth import Acl, Auth

pytestmark = pytest.mark.unit


def conn(listener: Listener | None = None, identity: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(listener=listener, tls_identity=identity, peer="127.0.0.1:1")


def test_a_claimed_user_name_nothing_verifies_makes_the_client_anonymous():
    c = Connect("c", username="alice", password=b"pw")
    assert anonymous_check(None, conn(Listener(allow_anonymous=True)), c) is ANONYMOUS
    assert c.username == "alice"  # the client acts on the decision, not the check


def test_anonymous_clients_are_refused_where_the_listener_does_not_allow_them():
    decision = anonymous_check(None, conn(Listener(host="10.0.0.1", allow_anonymous=False)), Connect("c"))
    assert decision.refused == Reason.NOT_AUTHORIZED and "mqtt://10.0.0.1:1883" in decision.why


def test_a_certificate_listener_takes_the_identity_or_refuses():
    listener = Listener(scheme="mqtts", use_identity_as_username=True)
    assert anonymous_check(None, conn(listener, identity="dev-1"), Connect("c")) is ALLOWED
    assert anonymous_check(None, conn(listener), Connect("c")).refused == Reason.NOT_AUTHORIZED


def test_a_password_checked_elsewhere_goes_on_to_authentication():
    auth = Auth(passwords={"alice": "x"})
    assert anonymous_check(auth, conn(Listener(allow_anonymous=False)), Connect("c", username="alice")) is ALLOWED


def test_an_answer_is_refused_without_naming_the_password():
    c = Connect("c", username="alice", password=b"s3cret")
    decision = decided(None, c, Reason.BAD_USER_NAME_OR_PASSWORD)
    assert decision.refused == Reason.BAD_USER_NAME_OR_PASSWORD and "alice" in decision.why
    assert "s3cret" not in decision.why


def test_a_will_its_user_may_not_write_refuses_the_connect():
    acl = Auth(acl=Acl.parse("user alice\ntopic write ok/#\n"))
    allowed = Connect("c", username="alice", will=Will("ok/will", b""))
    refused = Connect("c", username="alice", will=Will("other/will", b""))
    assert decided(acl, allowed, None) is ALLOWED
    assert decided(acl, refused, None).refused == Reason.NOT_AUTHORIZED


def test_a_broken_plugin_refuses():
    async def broken() -> Reason | None:
        raise RuntimeError("plugin down")

    assert asyncio.run(plugin_reason(Connect("c"), broken())) == Reason.NOT_AUTHORIZED


@pytest.mark.parametrize("level,qos,code", [(4, 0, None), (4, 1, 0), (4, 2, 0), (MQTT_5, 1, Reason.NOT_AUTHORIZED),
                                            (MQTT_5, 2, Reason.NOT_AUTHORIZED)])
def test_a_refused_publish_is_answered_as_its_protocol_can(level, qos, code):
    ack = publish_refusal("c", level, Publish("$SYS/x", b"", qos, packet_id=7 if qos else None))
    if code is None:
        assert ack is None
    else:
        assert ack[0] >> 4 == (4 if qos == 1 else 5) and ack[2:4] == b"\x00\x07"
        assert (ack[4] if len(ack) > 4 else 0) == code
