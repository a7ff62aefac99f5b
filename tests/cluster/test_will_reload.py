"""A delayed will whose user a reload removed, with the session replicated (``--replication-factor
2``): the replica must not publish it when the will's node dies before its delay ran out.

A reload drops such a will on the node that holds the session (router/access.py); a follower holds
a copy of that session, will and all (cluster/replication/sessions.py), and publishes the will
when due if the node is silent then (cluster/replication/wills.py). The copy must lose the will as
soon as the node's does, not at the next routine snapshot (up to two seconds later): a node killed
in between would leave the follower to publish, as a user that no longer exists, a will its own
node had dropped. And a reload on the follower itself must drop the wills it holds of that user
(``Replication.drop_users_wills``).
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from brokerd.cluster.replication.rules import follower_nodes
from tests.cluster.test_replication import snapshot_of, three_nodes
from tests.helpers import Client, add_user, wait_for

WILL_DELAY = 8  # s: the holder's copy taken, a reload, a kill and a silence noticed all come before it


def logged_in(node, client_id: str, user: str, **kw) -> Client:
    c = Client(node.port, client_id, host=node.host, **kw)
    c.c.username_pw_set(user, f"{user}-pw")
    return c


def dropped_with_a_will(start_broker, tmp_path) -> tuple[dict, str, Client, float]:
    """Nodes a, b, c (R = 2; c follows a's log) sharing a password file of users ``dev`` and
    ``keep``; a watcher (``keep``) of the wills on b; ``dev``'s device on a, MQTT 5, a persistent
    session and a QoS 1 will delayed by ``WILL_DELAY``, dropped (an abnormal close), and c's copy
    of its session holding the will. Returns (nodes, u, watcher, when the device dropped)."""
    assert follower_nodes("a/w0", "a", ["b", "c"], 1) == ["c"]  # the layout rests on it
    pw = tmp_path / "passwd"
    for user in ("dev", "keep"):
        add_user(pw, user, f"{user}-pw")
    nodes = three_nodes(start_broker, "--replication-factor", "2", "--password-file", str(pw))
    u = uuid.uuid4().hex[:6]
    watcher = logged_in(nodes["b"], f"w{u}", "keep").connect()
    watcher.subscribe(f"will{u}/#", 1)
    connect_props = Properties(PacketTypes.CONNECT)
    connect_props.SessionExpiryInterval = 300
    device = logged_in(nodes["a"], f"d{u}", "dev", clean=False, protocol=mqtt.MQTTv5, properties=connect_props)
    will_props = Properties(PacketTypes.WILLMESSAGE)
    will_props.WillDelayInterval = WILL_DELAY
    device.c.will_set(f"will{u}/gone", b"gone", 1, False, will_props)
    device.connect()
    device.drop()  # the will waits with the offline session
    dropped_at = time.monotonic()
    snapshot_of(nodes["c"], lambda r: r.get("wills", {}).get("a/w0") == 1)  # c's copy has the will
    return nodes, u, watcher, dropped_at


def remove_dev(tmp_path) -> None:
    """The password file rewritten without ``dev`` (as an operator replaces it: whole)."""
    (tmp_path / "passwd.new").unlink(missing_ok=True)
    add_user(tmp_path / "passwd.new", "keep", "keep-pw")
    os.replace(tmp_path / "passwd.new", tmp_path / "passwd")


def no_will_from_c(nodes: dict, u: str, watcher: Client, dropped_at: float) -> None:
    """Past the will's time (and c's turn among the holders), c still holds a's session of
    ``dev`` but not its will, and a marker published then is all the watcher got."""
    assert time.monotonic() - dropped_at < WILL_DELAY - 2, "too slow to test: the will's time came first"
    time.sleep(max(0.0, dropped_at + WILL_DELAY + 2 - time.monotonic()))
    snapshot_of(nodes["c"], lambda r: r.get("sessions", {}).get("a/w0") == 1 and not r.get("wills", {}).get("a/w0"))
    marker = logged_in(nodes["b"], f"m{u}", "keep").connect()
    marker.publish(f"will{u}/marker", b"marker", qos=1)
    watcher.wait_payload(b"marker")
    assert [m.payload for m in watcher.messages] == [b"marker"], "a removed user's will went out from the replica"
    assert "published here" not in nodes["c"].log_text()


def test_a_will_dropped_by_a_reload_is_not_published_by_the_replica_when_its_node_dies(start_broker, tmp_path):
    """A reload on a removes ``dev``, and a is SIGKILLed at once, the moment its log says the
    will was dropped: c, serving a's sessions now, must have lost the will with it (before, its
    copy kept the will until a's next routine snapshot, up to two seconds, and c published it)."""
    nodes, u, watcher, dropped_at = dropped_with_a_will(start_broker, tmp_path)
    remove_dev(tmp_path)
    os.kill(nodes["a"].pid, signal.SIGHUP)
    nodes["a"].wait_log(f"delayed will of d{u} dropped: user 'dev' is no longer in the password file")
    nodes["a"].kill()
    nodes["c"].wait_log("router a/w0 silent", timeout=10)
    no_will_from_c(nodes, u, watcher, dropped_at)


def test_a_reload_on_the_replica_drops_the_held_will_of_a_removed_user(start_broker, tmp_path):
    """a dies first (c holds the will of its offline session, to publish when due); then a reload
    on c removes ``dev``. The held will is a publish as ``dev``, later, as the will of one of c's
    own sessions would be: it must be dropped too."""
    nodes, u, watcher, dropped_at = dropped_with_a_will(start_broker, tmp_path)
    nodes["a"].kill()
    nodes["c"].wait_log("router a/w0 silent", timeout=10)
    remove_dev(tmp_path)
    reloads = nodes["c"].log_text().count("password and ACL files reloaded")
    os.kill(nodes["c"].pid, signal.SIGHUP)
    wait_for(lambda: nodes["c"].log_text().count("password and ACL files reloaded") > reloads, what="c reloaded")
    no_will_from_c(nodes, u, watcher, dropped_at)
