"""A session is its owner's, and every delivery obeys the ACL of the identity it goes to.

Against a real brokerd with a password file (``brokerd passwd``) and an ACL file. The brokers here
have one worker: the takeover they test is the one router's own; tests/cluster/test_session_owner.py
moves sessions between two workers.
"""

from __future__ import annotations

import os
import signal

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.helpers import Client, add_user, cid
from tests.integration.test_listeners import certs  # noqa: F401 - a fixture

PASSWORDS = {"alice": "alices-pw", "bob": "bobs-pw", "pub": "pubs-pw"}
ACL = """
user alice
topic readwrite a/#
user bob
topic readwrite b/#
user pub
topic readwrite #
"""
NOT_AUTHORIZED = 0x87  # paho reports 3.1.1's CONNACK 5 as MQTT 5's 0x87


@pytest.fixture
def files(tmp_path):
    pw = tmp_path / "passwd"
    for user, password in PASSWORDS.items():
        add_user(pw, user, password)
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    return pw, acl


def client(port: int, user: str, client_id: str, clean: bool = True, **kwargs) -> Client:
    c = Client(port, client_id, clean=clean, **kwargs)
    c.c.username_pw_set(user, PASSWORDS[user])
    return c


def start(start_broker, files, *args: str):
    pw, acl = files
    return start_broker("--password-file", str(pw), "--acl-file", str(acl), *args, workers=1)


def reload(broker) -> None:
    before = broker.log_text().count("password and ACL files reloaded")
    os.kill(broker.pid, signal.SIGHUP)
    from tests.helpers import wait_for

    wait_for(lambda: broker.log_text().count("password and ACL files reloaded") > before, what="the reload")


def alice_offline_with_queue(port: int, client_id: str) -> None:
    """alice's persistent session, subscribed to a/# and $share/grp/a/#, offline with a/1 queued."""
    alice = client(port, "alice", client_id, clean=False).connect()
    assert alice.subscribe([("a/#", 1), ("$share/grp/a/#", 1)]) == [1, 1]
    alice.disconnect()
    client(port, "pub", cid("pub")).connect().publish("a/1", "queued for alice", 1)


@pytest.mark.parametrize("log", ["on", "off"])
def test_another_user_is_refused_and_the_owners_session_survives(start_broker, files, log):
    b = start(start_broker, files, "--log", log)
    alice_id = cid("alice-dev")
    alice_offline_with_queue(b.port, alice_id)
    client(b.port, "bob", alice_id, clean=False).connect(expect_rc=NOT_AUTHORIZED)
    client(b.port, "bob", alice_id, clean=True).connect(expect_rc=NOT_AUTHORIZED)  # nor may he end it
    client(b.port, "pub", cid("pub")).connect().publish("a/2", "live", 1)
    alice = client(b.port, "alice", alice_id, clean=False).connect()
    assert alice.session_present
    alice.wait_payload(b"queued for alice")
    alice.wait_payload(b"live")
    text = b.log_text()
    assert f"client '{alice_id}'" in text and "belongs to user 'alice'" in text and "not to user 'bob'" in text
    assert not any(pw in text for pw in PASSWORDS.values())


def test_a_connected_owner_is_not_disconnected_by_a_refused_claim(start_broker, files):
    b = start(start_broker, files)
    alice_id = cid("alice-dev")
    alice = client(b.port, "alice", alice_id, clean=False).connect()
    assert alice.subscribe("a/#", 1) == [1]
    client(b.port, "bob", alice_id, clean=False).connect(expect_rc=NOT_AUTHORIZED)
    client(b.port, "pub", cid("pub")).connect().publish("a/x", "still hers", 1)
    assert alice.wait_topic("a/x").payload == b"still hers"
    assert not alice.disconnected.is_set()


def test_replace_gives_the_other_user_a_clean_session(start_broker, files):
    b = start(start_broker, files, "--session-owner", "replace", "--log", "off")
    alice_id = cid("alice-dev")
    alice_offline_with_queue(b.port, alice_id)
    bob = client(b.port, "bob", alice_id, clean=False).connect()
    assert not bob.session_present
    assert bob.subscribe("b/marker", 1) == [1]
    pub = client(b.port, "pub", cid("pub")).connect()
    pub.publish("a/3", "not for bob", 1)
    pub.publish("b/marker", "end", 1)
    bob.wait_topic("b/marker")
    assert [m.topic for m in bob.messages] == ["b/marker"], "bob got something of alice's session"
    text = b.log_text()
    assert f"session {alice_id} of user 'alice' dropped: user 'bob' connected with its client id" in text
    bob.disconnect()
    alice = client(b.port, "alice", alice_id, clean=False).connect()
    assert not alice.session_present


def test_a_queued_message_whose_read_grant_was_revoked_is_not_delivered(start_broker, files):
    # --log off: the offline session holds copies (with the log it reads the log back, by the ACL
    # of its identity already).
    b = start(start_broker, files, "--log", "off")
    _, acl = files
    alice_id = cid("alice-q")
    alice = client(b.port, "alice", alice_id, clean=False).connect()
    assert alice.subscribe("a/#", 1) == [1]
    alice.disconnect()
    pub = client(b.port, "pub", cid("pub")).connect()
    pub.publish("a/secret", "revoked", 1)
    pub.publish("a/open", "still granted", 1)
    acl.write_text(ACL.replace("topic readwrite a/#", "topic readwrite a/open"))
    reload(b)
    alice = client(b.port, "alice", alice_id, clean=False).connect()
    assert alice.session_present
    alice.wait_topic("a/open")  # queued after a/secret: that one would have come first
    assert [m.topic for m in alice.messages] == ["a/open"]


def test_a_revoked_read_grant_stops_shared_deliveries(start_broker, files):
    b = start(start_broker, files)
    _, acl = files
    alice = client(b.port, "alice", cid("alice-s")).connect()
    assert alice.subscribe([("$share/grp/a/#", 1), ("a/open", 1)]) == [1, 1]
    pub = client(b.port, "pub", cid("pub")).connect()
    pub.publish("a/secret", "before", 1)
    alice.wait_payload(b"before")
    acl.write_text(ACL.replace("topic readwrite a/#", "topic readwrite a/open"))
    reload(b)
    pub.publish("a/secret", "after", 1)
    pub.publish("a/open", "marker", 1)
    alice.wait_payload(b"marker")
    assert b"after" not in [m.payload for m in alice.messages]


def test_sighup_removing_a_user_disconnects_them(start_broker, files):
    b = start(start_broker, files)
    pw, _ = files
    alice = client(b.port, "alice", cid("alice-rm")).connect()
    bob = client(b.port, "bob", cid("bob-stays")).connect()
    pw.write_text("".join(line + "\n" for line in pw.read_text().splitlines() if not line.startswith("alice:")))
    reload(b)
    assert alice.disconnected.wait(10), "alice, removed from the password file, is still connected"
    b.wait_log("user 'alice' is no longer in the password file")
    assert not bob.disconnected.is_set()
    client(b.port, "alice", cid("alice-rm")).connect(expect_rc=0x86)


def test_a_delayed_will_whose_write_grant_was_revoked_is_not_published(start_broker, files):
    b = start(start_broker, files)
    _, acl = files
    watcher = client(b.port, "pub", cid("watch")).connect()
    assert watcher.subscribe([("a/will", 1), ("a/marker", 1)]) == [1, 1]
    will_props = Properties(PacketTypes.WILLMESSAGE)
    will_props.WillDelayInterval = 3
    connect_props = Properties(PacketTypes.CONNECT)
    connect_props.SessionExpiryInterval = 300
    alice_id = cid("alice-will")
    alice = client(b.port, "alice", alice_id, clean=False, protocol=mqtt.MQTTv5,
                   will=("a/will", b"alice is gone", 1, False, will_props), properties=connect_props)
    alice.connect()
    alice.drop()  # no DISCONNECT: the will waits its 3 s with the session
    acl.write_text(ACL.replace("topic readwrite a/#", "topic read a/#"))
    reload(b)
    b.wait_log(f"will of {alice_id} on 'a/will' not published")
    client(b.port, "pub", cid("pub")).connect().publish("a/marker", "after the will was due", 1)
    watcher.wait_topic("a/marker")
    assert [m.topic for m in watcher.messages] == ["a/marker"]


def test_a_reload_keeps_clients_whose_certificate_is_their_login(start_broker, files, certs):  # noqa: F811
    from tests.integration.test_listeners import LClient, _ports, _tls_args

    pw, acl = files
    (tls,) = _ports(1)
    b = start_broker("--listen", f"mqtts://127.0.0.1:{tls}", "--password-file", str(pw), "--acl-file", str(acl),
                     *_tls_args(certs, "--require-certificate", "on", "--use-identity-as-username", "on"),
                     workers=1)
    device = LClient(tls, cid("device"), tls={"ca_certs": certs["ca.pem"], "certfile": certs["client.pem"],
                                               "keyfile": certs["client.key"]}).connect()
    alice = client(b.port, "alice", cid("alice-rm")).connect()
    pw.write_text("".join(line + "\n" for line in pw.read_text().splitlines() if not line.startswith("alice:")))
    reload(b)
    assert alice.disconnected.wait(10)
    assert not device.disconnected.is_set(), "device-7, logged in by its certificate, was disconnected"


def test_a_session_kept_under_a_password_file_resumes_once_nothing_verifies_names(start_broker, files, tmp_path):
    """An operator who stops checking passwords makes every client anonymous: the sessions kept
    under the names the file verified (or, as an earlier version kept them, under names nobody
    verified) are resumed by their clients, not refused as another user's for ever."""
    data = str(tmp_path / "kept")
    pw, acl = files
    b = start_broker("--password-file", str(pw), "--acl-file", str(acl), workers=1, data_dir=data)
    alice_id = cid("alice-dev")
    alice_offline_with_queue(b.port, alice_id)
    assert b.stop() == 0
    b = start_broker(data_dir=data, workers=1)
    alice = Client(b.port, alice_id, clean=False)
    alice.c.username_pw_set("alice", "anything: nothing checks it now")
    alice.connect()
    assert alice.session_present
    assert alice.wait_topic("a/1").payload == b"queued for alice"


def test_a_refused_connect_never_publishes_its_will(start_broker, tmp_path):
    """A CONNECT refused (here: another user's session, --session-owner refuse) made no session, so
    its will is never published (MQTT-3.1.2-8): before, the will was set before the refusal and
    went out when the refused connection closed, ACL permitting (the pub user may write anywhere)."""
    pw = tmp_path / "passwd"
    for user, password in PASSWORDS.items():
        add_user(pw, user, password)
    broker = start_broker("--password-file", str(pw), workers=1)  # no ACL: nothing else stops the will
    owner_id = cid("owned")
    owner = client(broker.port, "alice", owner_id, clean=False).connect()
    owner.disconnect()
    watcher = client(broker.port, "alice", cid("watch")).connect()
    watcher.subscribe("will/refused", 1)
    intruder = client(broker.port, "pub", owner_id, clean=False, will=("will/refused", b"must not", 1, False))
    intruder.connect(expect_rc=NOT_AUTHORIZED)
    marker = client(broker.port, "alice", cid("marker")).connect()
    marker.publish("will/refused", b"after", qos=1)
    got = [m.payload for m in watcher.wait_messages(1)]
    assert got == [b"after"], got
