"""Authentication and ACLs against a real brokerd: Mosquitto's files, reason codes, reload, plugin."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import paho.mqtt.client as mqtt
import pytest

from tests.cluster.conftest import client_worker
from tests.helpers import BROKERD, Client, RawClient, add_user, cid, free_port, wait_for

PASSWORD = "Sup3r-s3cret-pw"
ACL = """
topic read public/#
user alice
topic readwrite alice/#
topic read sensors/#
topic deny sensors/secret
user bob
topic readwrite #
pattern readwrite clients/%c/#
"""


@pytest.fixture
def files(tmp_path):
    pw = tmp_path / "passwd"
    add_user(pw, "alice", PASSWORD)
    add_user(pw, "bob", "bobs-pw")
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    return pw, acl


def _client(port: int, user: str | None, password: str | None, v5: bool = False, client_id: str = "",
            clean: bool = True, host: str = "127.0.0.1") -> Client:
    c = Client(port, client_id or cid("a"), protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311, clean=clean,
               host=host)
    if user is not None:
        c.c.username_pw_set(user, password)
    return c


@pytest.mark.parametrize("v5", [False, True])
def test_credentials_and_reason_codes(start_broker, files, v5):
    pw, _ = files
    b = start_broker("--password-file", str(pw))
    _client(b.port, "alice", PASSWORD, v5).connect()
    _client(b.port, "alice", "wrong", v5).connect(expect_rc=0x86)
    _client(b.port, "nobody", PASSWORD, v5).connect(expect_rc=0x86)
    _client(b.port, None, None, v5).connect(expect_rc=0x87)
    log = b.log_text()
    assert "bad user name or password" in log and "anonymous clients not allowed" in log
    assert PASSWORD not in log and "wrong" not in log


def test_allow_anonymous_explicitly(start_broker, files):
    pw, _ = files
    b = start_broker("--password-file", str(pw), "--allow-anonymous", "on")
    _client(b.port, None, None).connect()
    _client(b.port, "alice", "wrong").connect(expect_rc=0x86)


def test_raw_connect_refused_gets_connack_5(start_broker, files):
    pw, _ = files
    b = start_broker("--password-file", str(pw))
    raw = RawClient(b.port)
    from tests.helpers import connect_packet

    raw.send(connect_packet("raw-anon"))
    assert raw.recv_until_closed() == bytes([0x20, 2, 0, 5])  # 3.1.1: not authorized
    raw = RawClient(b.port)
    user, password = b"alice", b"wrong"
    var = b"\x00\x04MQTT\x04\xc2\x00\x3c"
    body = var + b"\x00\x03raw" + len(user).to_bytes(2, "big") + user + len(password).to_bytes(2, "big") + password
    raw.send(bytes([0x10, len(body)]) + body)
    assert raw.recv_until_closed() == bytes([0x20, 2, 0, 4])  # 3.1.1: bad user name or password


@pytest.mark.skipif(shutil.which("mosquitto_passwd") is None, reason="mosquitto_passwd not installed")
def test_mosquitto_passwd_file_works_with_brokerd(start_broker, tmp_path):
    pw = tmp_path / "mpw"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(pw), "carol", "carols-pw"], check=True, timeout=30)
    b = start_broker("--password-file", str(pw))
    _client(b.port, "carol", "carols-pw").connect()
    _client(b.port, "carol", "nope").connect(expect_rc=0x86)


@pytest.mark.skipif(shutil.which("mosquitto") is None and not os.path.exists("/usr/sbin/mosquitto"),
                    reason="mosquitto not installed")
def test_brokerd_passwd_file_works_with_mosquitto(tmp_path):
    pw = tmp_path / "bpw"
    add_user(pw, "dave", "daves-pw")
    port = free_port()
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(("user root\n" if os.geteuid() == 0 else "") + f"listener {port} 127.0.0.1\nallow_anonymous false\npassword_file {pw}\n")
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    proc = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        wait_for(listening, what="mosquitto listening")
        _client(port, "dave", "daves-pw").connect()
        _client(port, "dave", "wrong").connect(expect_rc=0x87)  # Mosquitto 2 says "not authorized" (paho: 0x87)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("v5", [False, True])
def test_acl_subscribe_publish_and_wildcard_delivery(start_broker, files, v5):
    pw, acl = files
    b = start_broker("--password-file", str(pw), "--acl-file", str(acl))
    alice = _client(b.port, "alice", PASSWORD, v5).connect()
    bob = _client(b.port, "bob", "bobs-pw", v5).connect()
    denied = 0x87 if v5 else 0x80
    assert alice.subscribe("bob/#", 1) == [denied]
    assert alice.subscribe("sensors/secret", 1) == [denied]
    assert alice.subscribe("sensors/#", 1) == [1]
    bob.publish("sensors/secret", "hidden", 1, retain=True)
    bob.publish("sensors/kitchen", "ok", 1)
    assert [m.topic for m in alice.wait_messages(1)] == ["sensors/kitchen"]
    # A publish alice may not make: MQTT 3.1.1 drops it silently (acknowledged), MQTT 5 says 0x87.
    watcher = _client(b.port, "bob", "bobs-pw", v5).connect()
    watcher.subscribe("#", 1)
    info = alice.c.publish("sensors/kitchen", "from alice", 1)
    info.wait_for_publish(10)
    alice.publish("alice/ok", "mine", 1)
    watcher.wait_topic("alice/ok")
    assert not any(m.topic == "sensors/kitchen" and m.payload == b"from alice" for m in watcher.messages)
    # the retained secret is not handed to a new wildcard subscription either
    late = _client(b.port, "alice", PASSWORD, v5).connect()
    late.subscribe("sensors/#", 1)
    bob.publish("sensors/hall", "x", 1)
    late.wait_topic("sensors/hall")
    assert not any(m.topic == "sensors/secret" for m in late.messages + alice.messages)


def test_v5_publish_denied_gets_puback_0x87(start_broker, files):
    pw, acl = files
    b = start_broker("--password-file", str(pw), "--acl-file", str(acl))
    alice = _client(b.port, "alice", PASSWORD, True).connect()
    codes: list[int] = []
    done = threading.Event()

    def on_publish(c, u, mid, rc, props):
        codes.append(rc.value)
        done.set()

    alice.c.on_publish = on_publish
    alice.c.publish("bob/x", "no", 1)
    assert done.wait(10)
    assert codes == [0x87]


@pytest.mark.parametrize("v5", [False, True])
def test_sys_publish_refused_even_without_acl(start_broker, v5):
    b = start_broker()
    pub = _client(b.port, None, None, v5).connect()
    sub = _client(b.port, None, None, v5).connect()
    sub.subscribe("$SYS/fake/#", 0)
    sub.subscribe("done", 0)
    pub.publish("$SYS/fake/x", "forged", 1)
    pub.publish("done", "1", 1)
    sub.wait_topic("done")
    assert not any(m.topic.startswith("$SYS/fake") for m in sub.messages)


def test_takeover_across_workers_keeps_identity_and_acl(start_broker, files):
    pw, acl = files
    b = start_broker("--password-file", str(pw), "--acl-file", str(acl), workers=2)
    bob = _client(b.port, "bob", "bobs-pw").connect()
    client_id = cid("alice-persist")
    from tests.cluster.conftest import client_worker

    workers: set[int] = set()
    for i in range(12):  # until the kernel has put the session on both workers (bounded)
        alice = _client(b.port, "alice", PASSWORD, client_id=client_id, clean=False).connect()
        workers.add(client_worker(b, alice))
        if i == 0:
            assert alice.subscribe("sensors/#", 1) == [1]
        alice.disconnect()
        bob.publish("sensors/secret", f"s{i}", 1)
        bob.publish("sensors/open", f"o{i}", 1)
        alice = _client(b.port, "alice", PASSWORD, client_id=client_id, clean=False).connect()
        got = alice.wait_messages(1)
        wait_for(lambda a=alice, i=i: any(m.payload == f"o{i}".encode() for m in a.messages),
                 what="the allowed message")
        assert all(m.topic == "sensors/open" for m in got + alice.messages)
        workers.add(client_worker(b, alice))
        alice.disconnect()
        if len(workers) == 2 and i >= 1:
            break
    assert len(workers) == 2, "the session never moved to the other worker"


def test_sighup_reloads_password_file_without_dropping_clients(start_broker, files):
    pw, acl = files
    b = start_broker("--password-file", str(pw), "--acl-file", str(acl))
    alice = _client(b.port, "alice", PASSWORD).connect()
    alice.subscribe("alice/#", 1)
    _client(b.port, "erin", "erins-pw").connect(expect_rc=0x86)
    add_user(pw, "erin", "erins-pw")
    os.kill(b.pid, signal.SIGHUP)
    b.wait_log("password and ACL files reloaded")
    _client(b.port, "erin", "erins-pw").connect()
    alice.publish("alice/still", "here", 1)
    alice.wait_topic("alice/still")
    assert not alice.disconnected.is_set()
    # a file that no longer reads keeps the old configuration
    pw.write_text("erin:plaintext\n")
    os.kill(b.pid, signal.SIGHUP)
    b.wait_log("reload failed")
    _client(b.port, "erin", "erins-pw").connect()
    assert "erins-pw" not in b.log_text()


class _AuthService(BaseHTTPRequestHandler):
    calls: list[dict] = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _AuthService.calls.append(body)
        ok = body["username"] == "http-user" and body["password"] == "http-pw"
        self.send_response(200 if ok else 403)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if ok:
            self.wfile.write(b'{"result": "allow"}')

    def log_message(self, *a):
        pass


def test_http_plugin(start_broker):
    server = HTTPServer(("127.0.0.1", 0), _AuthService)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _AuthService.calls.clear()
    try:
        url = f"http://127.0.0.1:{server.server_port}/auth"
        b = start_broker("--auth-plugin", "brokerd.cluster.auth_http:HttpAuth", "--auth-plugin-opt", f"url={url}")

        def h1() -> Client:
            c = _client(b.port, "http-user", "http-pw", client_id="h1")
            c.c.reconnect_delay_set(60, 120)  # taken over by the next h1: paho must not fight back
            return c.connect()

        ok = h1()
        _client(b.port, "http-user", "bad", client_id="h2").connect(expect_rc=0x86)
        _client(b.port, "http-user", "bad", True, client_id="h3").connect(expect_rc=0x86)
        _client(b.port, None, None).connect(expect_rc=0x87)
        # Each worker's plugin caches its own answers: h1 again until it has connected on both
        # workers (the kernel spreads new connections over them; bounded). From then on an h1
        # connection is answered from the cache wherever it lands.
        seen = {client_worker(b, ok)}
        wait_for(lambda: seen.add(client_worker(b, h1())) or len(seen) == 2, what="h1 connected on both workers")
        n = len(_AuthService.calls)
        h1()  # cached
        assert len(_AuthService.calls) == n
        other = _client(b.port, "http-user", "http-pw", client_id="h4").connect()
        other.subscribe("t", 0)
        ok2 = _client(b.port, "http-user", "http-pw", client_id="h5").connect()
        ok2.publish("t", "x", 1)
        other.wait_topic("t")
        assert ok.disconnected.wait(10)  # h1 again took its session over: the cached answer let it in
        assert "http-pw" not in b.log_text()
    finally:
        server.shutdown()
        server.server_close()


def test_unconfigured_broker_unaffected(start_broker):
    b = start_broker()
    a = _client(b.port, "anyone", "anything").connect()
    a.subscribe("x/#", 1)
    a.publish("x/y", "1", 1)
    a.wait_topic("x/y")


def test_auth_failures_and_acl_denials_are_counted_in_stats_and_metrics(start_broker, files):
    """Refused CONNECTs and ACL refusals show in the snapshot (`brokerd stats --json`) and on /metrics."""
    import time
    import urllib.request

    pw, acl = files
    metrics = free_port()
    b = start_broker("--password-file", str(pw), "--acl-file", str(acl), "--stats-interval", "0.2",
                     "--metrics-port", str(metrics))
    _client(b.port, "alice", "wrong").connect(expect_rc=0x86)
    _client(b.port, None, None, True).connect(expect_rc=0x87)
    alice = _client(b.port, "alice", PASSWORD).connect()
    assert alice.subscribe("bob/#", 1) == [0x80]  # denied filter
    alice.publish("bob/x", "no", 1)  # denied publish (MQTT 3.1.1: acknowledged, dropped)
    alice.subscribe("alice/#", 1)  # allowed: not counted
    # Each router counts what happened on its connections (wherever the kernel put them): the
    # node's counts are the sums over its two routers.
    locate = ["--node-id", "t", "--listen", f"{b.host}:{b.port}", "--stats-interval", "0.2", "--workers", "2"]
    deadline = time.monotonic() + 20
    while True:
        out = subprocess.run([BROKERD, "stats", "--json", *locate], capture_output=True, text=True, timeout=30)
        snaps = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        got = [s["auth"] for s in snaps if s.get("kind") == "router"]
        if len(got) == 2 and [sum(a[k] for a in got) for k in ("failures_total", "denied_total")] == [2, 2]:
            break
        assert time.monotonic() < deadline, (got, out.stderr)
        time.sleep(0.2)
    text = ""

    def node_total(name: str) -> float:
        values = re.findall(rf'^{name}{{node="t",router="w[01]"}} (\S+)$', text, re.MULTILINE)
        return sum(map(float, values)) if len(values) == 2 else -1.0

    while time.monotonic() < deadline:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
        except OSError:
            text = ""
        if node_total("brokerd_auth_failures_total") == 2 and node_total("brokerd_acl_denied_total") == 2:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(text)
