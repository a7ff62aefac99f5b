"""Trust at the seams (issue 40): where a user name comes from and who checks it, against a real brokerd.

A user name counts only where something verifies it (the password file, a plugin, or the client
certificate of a use_identity_as_username listener); the quick start works as typed; a certificate
that names no one is refused; the HTTP plugin reads only its documented answers and stays bounded.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from tests.helpers import BROKERD, ROOT, Broker, Client, cid, free_port, in_parallel
from tests.integration.test_listeners import LClient, _openssl

NOT_AUTHORIZED = 0x87  # paho reports CONNACK 0x05 (MQTT 3.1.1) as 0x87
ACL = """
topic read public/#
user admin
topic readwrite #
user device-7
topic readwrite devices/7/#
"""

needs_mosquitto_clients = pytest.mark.skipif(
    shutil.which("mosquitto_sub") is None or shutil.which("mosquitto_pub") is None,
    reason="needs mosquitto_sub and mosquitto_pub (mosquitto-clients)")


def _client(port: int, user: str | None, password: str | None = None, name: str = "c",
            client_id: str | None = None) -> Client:
    c = Client(port, client_id or cid(name))
    if user is not None:
        c.c.username_pw_set(user, password)
    return c


# -- the quick start, as README has it -----------------------------------------------------------------

# README's lines, word for word (checked): the brokers run with these arguments, the clients as typed,
# each on a free port instead of 1883 (and -C 1 -W 10: one message, then exit).
LOCAL = "./scripts/run --port 1883"
SUB, PUB = "mosquitto_sub -t 'demo/#' -v", "mosquitto_pub -t demo/hello -m hi"
PASSWD = ".venv/bin/brokerd passwd -b passwd alice s3cret"
NETWORK = "./scripts/run --listen mqtt://0.0.0.0:1883 --password-file passwd"
USER_SUB, USER_PUB = "mosquitto_sub -u alice -P s3cret -t 'demo/#' -v", "mosquitto_pub -u alice -P s3cret -t demo/hello -m hi"


def _quick_start_block() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("## Quick start", 1)[1].split("\n## ", 1)[0]


def _broker(xprocess, tmp_path: Path, line: str, port: int, name: str) -> Broker:
    """``./scripts/run ARGS`` is ``brokerd ARGS`` once .venv exists: the same arguments, on a free port
    instead of 1883, with a data directory of the test's own (the quick start's is ./data)."""
    args = [a.replace("1883", str(port)).replace("passwd", str(tmp_path / "passwd")) for a in line.split()[1:]]
    args += ["--data-dir", str(tmp_path / name), "--workers", "1"]
    return Broker(xprocess, f"quick-{name}-{port}", args, "127.0.0.1", port).start()


def _sub_then_pub(port: int, sub_line: str, pub_line: str) -> str:
    """The subscriber's output once the publisher's message reached it (published until it does:
    mosquitto_sub subscribes a moment after it starts)."""
    sub = subprocess.Popen(f"{sub_line} -C 1 -W 10 -p {port}", shell=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 10
        while sub.poll() is None and time.monotonic() < deadline:
            pub = subprocess.run(f"{pub_line} -p {port}", shell=True, capture_output=True, text=True, timeout=10)
            assert pub.returncode == 0, pub.stdout + pub.stderr
            time.sleep(0.2)
        out, _ = sub.communicate(timeout=15)
    finally:
        if sub.poll() is None:
            sub.kill()
    return out


@needs_mosquitto_clients
def test_the_quick_start_works_as_typed(xprocess, tmp_path):
    """``./scripts/run --port 1883`` listens on loopback with anonymous clients allowed, so the first
    mosquitto_sub a newcomer types gets in (it bound 0.0.0.0 and refused everyone); the lines that open
    the broker to the network with a user work too, and refuse anonymous clients there."""
    block = _quick_start_block()
    for line in (LOCAL, SUB, PUB, PASSWD, NETWORK, USER_SUB):
        assert line in block, f"README's quick start no longer says {line!r}"
    port = free_port()
    local = _broker(xprocess, tmp_path, LOCAL, port, "local")
    assert f"listener mqtt://127.0.0.1:{port}: anonymous clients allowed (loopback)" in local.log_text()
    assert _sub_then_pub(port, SUB, PUB) == "demo/hello hi\n"
    assert local.stop() == 0

    made = subprocess.run([BROKERD, *PASSWD.split()[1:3], str(tmp_path / "passwd"), *PASSWD.split()[-2:]],
                          capture_output=True, text=True, timeout=30)
    assert made.returncode == 0 and "added user alice" in made.stdout, made.stderr
    assert "s3cret" not in (tmp_path / "passwd").read_text()
    port = free_port("0.0.0.0")
    network = _broker(xprocess, tmp_path, NETWORK, port, "network")
    assert f"listener mqtt://0.0.0.0:{port}: anonymous clients refused" in network.log_text()
    assert _sub_then_pub(port, USER_SUB, USER_PUB) == "demo/hello hi\n"
    anonymous = subprocess.run(f"{SUB} -C 1 -W 10 -p {port}", shell=True, capture_output=True, text=True,
                               timeout=15)
    assert anonymous.returncode != 0 and "not authori" in (anonymous.stdout + anonymous.stderr).lower()
    assert network.stop() == 0


# -- a user name nothing verifies -------------------------------------------------------------------------

def test_a_user_name_alone_gets_in_nowhere_anonymous_clients_are_refused(start_broker, tmp_path):
    """No password file, no plugin: on a listener that refuses anonymous clients every client is refused
    (start-up says so), whatever user name it claims; where anonymous clients are allowed, a claimed
    name is no identity: the client gets the anonymous ACL, not the user's."""
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    open_port = free_port("0.0.0.0")
    b = start_broker("--listen", f"mqtt://0.0.0.0:{open_port}", "--acl-file", str(acl), "--log-level", "debug")
    assert (f"listener mqtt://0.0.0.0:{open_port}: every client refused: anonymous clients are not allowed here "
            "and no password file or auth plugin checks user names") in b.log_text()
    _client(open_port, "admin", name="claims-admin").connect(expect_rc=NOT_AUTHORIZED)
    _client(open_port, "admin", "whatever", name="claims-admin-pw").connect(expect_rc=NOT_AUTHORIZED)
    _client(open_port, None, name="anon-open").connect(expect_rc=NOT_AUTHORIZED)
    b.wait_log("no password file or auth plugin checks user names: every client is refused")

    claimer = _client(b.port, "admin", name="claims-admin-loopback").connect()
    assert claimer.subscribe("secret/x", 0) == [0x80]  # admin's grant (readwrite #) is not the claimer's
    assert claimer.subscribe("public/x", 0) == [0]  # the anonymous section is
    b.wait_log("ignored (no password file or auth plugin verifies it): anonymous")


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, str]:
    """A CA, a server certificate, a client certificate with CN device-7, and one signed by the same CA
    whose subject has no CN and which has no subject alternative name."""
    d = tmp_path_factory.mktemp("seam-certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=seams test CA",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, subject, ext in (("server", "/CN=localhost", ["-extfile", "server.ext"]),
                               ("client", "/CN=device-7", []), ("nameless", "/O=brokerd tests/OU=no name", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-out", f"{name}.pem", *ext, cwd=d)
    out = subprocess.run(["openssl", "x509", "-in", "nameless.pem", "-noout", "-subject", "-ext", "subjectAltName"],
                         cwd=d, capture_output=True, text=True, timeout=30).stdout
    assert "CN" not in out and "Alternative" not in out, out
    return {n: str(d / n) for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key",
                                     "nameless.pem", "nameless.key")}


def _tls_client(port: int, certs: dict[str, str], cert: str, name: str) -> LClient:
    return LClient(port, cid(name), tls={"ca_certs": certs["ca.pem"], "certfile": certs[f"{cert}.pem"],
                                         "keyfile": certs[f"{cert}.key"]})


def test_identities_come_only_from_the_certificates_of_the_identity_listener(start_broker, certs, tmp_path):
    """Next to a use_identity_as_username listener, a plain loopback client claiming ``admin`` is refused
    (nothing checks its claim, and anonymous clients are refused once identities are in use); on the
    TLS listener the certificate's CN is the user name, and a certificate without CN or SAN is refused
    rather than letting the client name itself."""
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    tls = free_port()
    b = start_broker("--listen", f"mqtts://127.0.0.1:{tls}", "--certfile", certs["server.pem"],
                     "--keyfile", certs["server.key"], "--cafile", certs["ca.pem"], "--require-certificate", "on",
                     "--use-identity-as-username", "on", "--acl-file", str(acl))
    assert f"listener mqtt://127.0.0.1:{b.port}: every client refused" in b.log_text()
    _client(b.port, "admin", name="plain-admin").connect(expect_rc=NOT_AUTHORIZED)
    _client(b.port, "device-7", name="plain-device").connect(expect_rc=NOT_AUTHORIZED)

    device = _tls_client(tls, certs, "client", "device")
    device.c.username_pw_set("admin", "x")  # ignored: the certificate names the client
    device.connect()
    assert device.subscribe("devices/7/#", 0) == [0] and device.subscribe("secret/x", 0) == [0x80]

    nameless = _tls_client(tls, certs, "nameless", "nameless")
    nameless.c.username_pw_set("admin", "x")
    nameless.connect(expect_rc=NOT_AUTHORIZED)
    b.wait_log("its certificate has no CN and no subject alternative name")


# -- the HTTP plugin: documented answers only, bounded ----------------------------------------------------

class _Service(BaseHTTPRequestHandler):
    """Answers by user name: ``slow`` after SLOW_S, ``garbage`` with HTML, anyone else allowed."""

    SLOW_S = 8.0
    lock = threading.Lock()
    active = 0
    asked: list[str] = []
    arrived: list[float] = []  # when each ``slow`` request came (monotonic)
    generation = 0  # raised by each test's fixture: a slow request of an earlier test counts nowhere

    def do_POST(self):  # noqa: N802
        user = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["username"]
        cls = _Service
        with cls.lock:
            cls.asked.append(user)
            if user == "slow":
                cls.arrived.append(time.monotonic())
            cls.active += 1
            generation = cls.generation
        try:
            if user == "slow":
                time.sleep(cls.SLOW_S)
            body = b"<html>Welcome!</html>" if user == "garbage" else b'{"result": "allow"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the broker gave up on a slow answer
        finally:
            with cls.lock:
                if cls.generation == generation:
                    cls.active -= 1

    def log_message(self, *a):
        pass


@pytest.fixture
def service():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    server.daemon_threads = True
    with _Service.lock:
        _Service.generation += 1
        _Service.active = 0
        _Service.asked = []
        _Service.arrived = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/auth"
    server.shutdown()
    server.server_close()


def test_http_auth_refuses_an_answer_it_does_not_understand(start_broker, service):
    """An HTML page with 200 (a proxy's, a misrouted URL's) once let every client in."""
    b = start_broker("--auth-plugin", "brokerd.cluster.auth_http:HttpAuth", "--auth-plugin-opt", f"url={service}")
    _client(b.port, "garbage", "garbage-secret", "garbage").connect(expect_rc=NOT_AUTHORIZED)
    _client(b.port, "garbage", "garbage-secret", "garbage-again").connect(expect_rc=NOT_AUTHORIZED)
    assert _Service.asked == ["garbage", "garbage"]  # a failure is not cached
    _client(b.port, "someone", "pw", "someone").connect()
    b.wait_log("the answer is not JSON")
    assert "garbage-secret" not in b.log_text()


def _refused_in_background(port: int, n: int) -> list[threading.Thread]:
    """``n`` CONNECTs of user ``slow``, each in its own thread, each expected to be refused."""
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            _client(port, "slow", "pw", f"slow{i}").connect(expect_rc=NOT_AUTHORIZED)
        except BaseException as exc:  # noqa: BLE001 - the test's thread reports it
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    threads.append(errors)  # type: ignore[arg-type]
    return threads


def _wait_active(n: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while _Service.active < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _Service.active >= n, _Service.active


def test_slow_http_answers_are_bounded_and_delay_no_one_else(start_broker, service, tmp_path):
    """Many CONNECTs whose answers are slow: at most max_concurrent requests per worker reach the
    service, each CONNECT is refused after timeout_s (waiting for a free request included), and
    meanwhile a password-file user and a client whose answer is cached connect at once."""
    pw = tmp_path / "passwd"
    subprocess.run([BROKERD, "passwd", "-b", str(pw), "alice", "alices-pw"], check=True, capture_output=True,
                   timeout=30)
    timeout_s = 5.0
    # One worker: the bound is per worker, and the service must see every request of that worker.
    b = start_broker("--password-file", str(pw), "--auth-plugin", "brokerd.cluster.auth_http:HttpAuth",
                     "--auth-plugin-opt", f"url={service}", "--auth-plugin-opt", f"timeout_s={timeout_s}",
                     "--auth-plugin-opt", "max_concurrent=2", workers=1)
    fast_id = cid("fast")  # the cache is per client id, user, address and password
    _client(b.port, "fast", "pw", client_id=fast_id).connect().disconnect()
    asked = len(_Service.asked)

    start = time.monotonic()
    *slow, errors = _refused_in_background(b.port, 6)
    _wait_active(2)

    def timed(c: Client) -> float:
        t = time.monotonic()
        c.connect()
        return time.monotonic() - t

    t_alice, t_fast = in_parallel(lambda: timed(_client(b.port, "alice", "alices-pw", "alice")),
                                  lambda: timed(_client(b.port, "fast", "pw", client_id=fast_id)))
    assert t_alice < 3 and t_fast < 3, (t_alice, t_fast)  # not behind the slow ones (5 s)
    for t in slow:
        t.join(timeout_s + 8)
    assert not errors, errors
    assert time.monotonic() - start < timeout_s + 4
    # Until the first requests time out, only two reach the service (the rest wait for a slot, then
    # time out): the unbounded plugin sent all six at once.
    first = _Service.arrived[0]
    assert len([t for t in _Service.arrived if t < first + timeout_s - 1]) == 2, _Service.arrived
    assert _Service.asked.count("fast") == 1 and len(_Service.asked) - asked <= 6
    b.wait_log(f"no answer within {timeout_s:g} s")


def test_a_plugin_client_waits_without_holding_up_the_loop(start_broker, service):
    """A CONNECT waiting for the service pauses only its own connection: other clients publish and
    receive meanwhile."""
    b = start_broker("--auth-plugin", "brokerd.cluster.auth_http:HttpAuth", "--auth-plugin-opt", f"url={service}",
                     "--auth-plugin-opt", "timeout_s=6", "--allow-anonymous", "on", workers=1)
    start = time.monotonic()
    *waiting, errors = _refused_in_background(b.port, 1)
    _wait_active(1)
    sub = Client(b.port, cid("sub"), protocol=mqtt.MQTTv5).connect()
    sub.subscribe("loop/#", 1)
    pub = _client(b.port, None, name="pub").connect()
    pub.publish("loop/alive", "yes", 1)
    assert sub.wait_topic("loop/alive").payload == b"yes"
    assert _Service.active == 1 and time.monotonic() - start < 6  # all of it while the CONNECT waited
    waiting[0].join(10)
    assert not errors, errors
