"""Listeners: mqtt://, mqtts:// (TLS), ws:// and wss:// (MQTT over WebSockets), each served by every
worker, with real certificates (made here with the openssl command), real clients (paho, mosquitto_pub
and mosquitto_sub, MQTT.js under Node) and messages crossing from one listener type to another."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.helpers import BROKERD, WAIT, Broker, Client, cid, connect_packet, free_port, wait_for

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate (CN device-7) signed by
    the CA, and one from another CA."""
    d = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=brokerd test CA",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, subject, ext in (("server", "/CN=localhost", ["-extfile", "server.ext"]),
                               ("client", "/CN=device-7", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-out", f"{name}.pem", *ext, cwd=d)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=stranger",
             "-keyout", "stranger.key", "-out", "stranger.pem", cwd=d)
    return {n: str(d / n) for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key",
                                     "stranger.pem", "stranger.key")}


def _tls_args(certs: dict[str, str], *extra: str) -> list[str]:
    return ["--certfile", certs["server.pem"], "--keyfile", certs["server.key"], "--cafile", certs["ca.pem"],
            *extra]


class LClient(Client):
    """tests.helpers.Client over another transport: TLS and/or WebSockets."""

    def __init__(self, port: int, client_id: str, *, websocket: bool = False, path: str = "/mqtt",
                 tls: dict | None = None) -> None:
        super().__init__(port, client_id)
        old = self.c
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311,
                             transport="websockets" if websocket else "tcp")
        for name in ("on_message", "on_connect", "on_subscribe", "on_disconnect", "on_unsubscribe"):
            setattr(self.c, name, getattr(old, name))
        old._reset_sockets()
        if websocket:
            self.c.ws_set_options(path=path)
        if tls is not None:
            self.c.tls_set(**tls)


def _ports(n: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


@pytest.fixture
def four(start_broker, certs):
    """A broker of two workers with one listener of each kind: returns (broker, ports by scheme)."""
    tls, ws, wss = _ports(3)
    broker = start_broker("--listen", f"mqtts://127.0.0.1:{tls}", "--listen", f"ws://127.0.0.1:{ws}/mqtt",
                          "--listen", f"wss://127.0.0.1:{wss}/mqtt", *_tls_args(certs), workers=2)
    return broker, {"mqtt": broker.port, "mqtts": tls, "ws": ws, "wss": wss}


def _client(scheme: str, ports: dict[str, int], certs: dict[str, str], name: str) -> LClient:
    tls = {"ca_certs": certs["ca.pem"]} if scheme in ("mqtts", "wss") else None
    return LClient(ports[scheme], cid(name), websocket=scheme in ("ws", "wss"), tls=tls)


def test_every_listener_type_reaches_every_other_across_workers(four, certs):
    broker, ports = four
    assert "MQTT on 127.0.0.1:" in broker.log_text() and f"wss://127.0.0.1:{ports['wss']}/mqtt" in broker.log_text()
    schemes = ("mqtt", "mqtts", "ws", "wss")
    # Several subscribers per listener: with two workers, SO_REUSEPORT puts some on each.
    subs = {s: [_client(s, ports, certs, f"sub-{s}").connect() for _ in range(3)] for s in schemes}
    for group in subs.values():
        for sub in group:
            assert sub.subscribe("x/#", 1) == [1]
    for s in schemes:
        pub = _client(s, ports, certs, f"pub-{s}").connect()
        pub.publish(f"x/{s}", f"from {s}".encode(), qos=1)
    for s, group in subs.items():
        for sub in group:
            got = {m.topic: m.payload for m in sub.wait_messages(4)}
            assert got == {f"x/{p}": f"from {p}".encode() for p in schemes}, (s, got)


def test_mosquitto_clients_over_mqtts_with_a_client_certificate(start_broker, certs):
    if shutil.which("mosquitto_pub") is None:
        pytest.skip("needs mosquitto-clients (scripts/test installs them)")
    (tls,) = _ports(1)
    start_broker("--listen", f"mqtts://127.0.0.1:{tls}", *_tls_args(certs, "--require-certificate", "on"))
    common = ["-h", "127.0.0.1", "-p", str(tls), "--cafile", certs["ca.pem"], "--cert", certs["client.pem"],
              "--key", certs["client.key"]]
    sub = subprocess.Popen(["mosquitto_sub", *common, "-t", "tls/#", "-C", "1", "-v", "-W", str(int(WAIT))],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # mosquitto_sub has no "subscribed" signal: publish retained, so the order does not matter.
        pub = subprocess.run(["mosquitto_pub", *common, "-t", "tls/hello", "-m", "over TLS", "-q", "1", "-r"],
                             capture_output=True, text=True, timeout=WAIT)
        assert pub.returncode == 0, pub.stderr
        out, err = sub.communicate(timeout=WAIT + 5)
    finally:
        sub.kill()
    assert out.strip() == "tls/hello over TLS", err


def test_require_certificate_refuses_a_client_without_one(start_broker, certs):
    (tls,) = _ports(1)
    broker = start_broker("--listen", f"mqtts://127.0.0.1:{tls}",
                          *_tls_args(certs, "--require-certificate", "on"))
    ok = LClient(tls, cid("with-cert"), tls={"ca_certs": certs["ca.pem"], "certfile": certs["client.pem"],
                                            "keyfile": certs["client.key"]}).connect()
    ok.disconnect()
    for cert in (None, "stranger"):
        ctx = ssl.create_default_context(cafile=certs["ca.pem"])
        if cert:
            ctx.load_cert_chain(certs[f"{cert}.pem"], certs[f"{cert}.key"])
        with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):
            with socket.create_connection(("127.0.0.1", tls), timeout=WAIT) as raw:
                with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                    s.sendall(connect_packet(cid("no-cert")))
                    assert s.recv(4), "no CONNACK: the connection was closed"  # TLS 1.3: refused here
    assert broker.workers()  # still serving


def test_use_identity_as_username_takes_the_certificates_cn(start_broker, certs):
    (tls,) = _ports(1)
    broker = start_broker("--listen", f"mqtts://127.0.0.1:{tls}", "--log-level", "debug",
                          *_tls_args(certs, "--require-certificate", "on", "--use-identity-as-username", "on"))
    assert "its CN is the username" in broker.log_text()
    c = LClient(tls, "id-client", tls={"ca_certs": certs["ca.pem"], "certfile": certs["client.pem"],
                                       "keyfile": certs["client.key"]})
    c.c.username_pw_set("someone-else", "pw")
    c.connect()
    broker.wait_log("client id-client (127.0.0.1:")
    broker.wait_log("user 'device-7' from its TLS certificate")


def test_tls_on_the_plain_port_names_the_tls_listener(start_broker, certs):
    (tls,) = _ports(1)
    broker = start_broker("--listen", f"mqtts://127.0.0.1:{tls}", *_tls_args(certs))
    ctx = ssl.create_default_context(cafile=certs["ca.pem"])
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        with socket.create_connection(("127.0.0.1", broker.port), timeout=WAIT) as raw:
            ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    broker.wait_log(f"TLS handshake on a plain MQTT listener (TLS is on mqtts://127.0.0.1:{tls})")


def test_websocket_needs_its_path_and_the_mqtt_subprotocol(start_broker):
    (ws,) = _ports(1)
    broker = start_broker("--listen", f"ws://127.0.0.1:{ws}/custom")
    LClient(ws, cid("ws-path"), websocket=True, path="/custom").connect().disconnect()
    for path, proto, status in (("/mqtt", "mqtt", b" 404 "), ("/custom", "chat", b" 400 ")):
        with socket.create_connection(("127.0.0.1", ws), timeout=WAIT) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                      f"Sec-WebSocket-Protocol: {proto}\r\n\r\n".encode())
            assert status in s.recv(1024)
    assert broker.workers()


def test_listener_options_are_checked_before_start(tmp_path, certs):
    from brokerd.cluster.config import ConfigError, load

    with pytest.raises(ConfigError, match="TLS needs --certfile and --keyfile"):
        load(["--listen", "mqtts://127.0.0.1:8883"], {})
    with pytest.raises(ConfigError, match="--require-certificate needs --cafile"):
        load(["--listen", "mqtts://127.0.0.1:8883", "--certfile", "a", "--keyfile", "b",
              "--require-certificate", "on"], {})
    with pytest.raises(ConfigError, match="port 1884 is also used by --listen"):
        load(["--listen", "127.0.0.1:1884", "--listen", "ws://0.0.0.0:1884/mqtt"], {})
    toml = tmp_path / "b.toml"
    toml.write_text(f'listen = "127.0.0.1:1883"\ncertfile = "{certs["server.pem"]}"\n'
                    f'keyfile = "{certs["server.key"]}"\n\n[[listener]]\nlisten = "mqtts://0.0.0.0:8883"\n'
                    f'cafile = "{certs["ca.pem"]}"\nrequire_certificate = true\ntls_version = "tlsv1.3"\n'
                    'max_connections = 10\n\n[[listener]]\nlisten = "ws://0.0.0.0:9001/mqtt"\n'
                    'allow_anonymous = true\n')
    cfg = load(["--config", str(toml)], {})
    plain, tls, ws = cfg.listeners
    assert cfg.listen == ("127.0.0.1", 1883) and plain.allow_anonymous and plain.tls_url == tls.url
    assert tls.require_certificate and tls.tls_version == "tlsv1.3" and tls.certfile == certs["server.pem"]
    assert tls.max_connections == 10 and not tls.allow_anonymous  # not loopback: refused unless allowed
    assert ws.allow_anonymous and ws.path == "/mqtt"
    assert load(["--config", str(toml), "--listen", "127.0.0.1:1999"], {}).listen == ("127.0.0.1", 1999)
    default = load([], {})
    assert default.listen == ("127.0.0.1", 1883) and default.listeners_implicit
    assert default.listeners[0].allow_anonymous
    toml.write_text('[[listener]]\nlisten = "mqtt://0.0.0.0:1883"\nbogus = 1\n')
    with pytest.raises(ConfigError, match="unknown key 'bogus'"):
        load(["--config", str(toml)], {})


def test_anonymous_clients_are_refused_on_a_non_loopback_listener_unless_allowed(start_broker, tmp_path):
    """Mosquitto 2's secure default: start-up says which rule applies to each listener, an
    anonymous client on the 0.0.0.0 one gets CONNACK 0x05 (not authorized) while the loopback
    listener lets it in, and --allow-anonymous on opens both."""
    (ws,) = _ports(1)
    broker = start_broker("--listen", f"ws://0.0.0.0:{ws}/mqtt")
    text = broker.log_text()
    assert f"listener mqtt://127.0.0.1:{broker.port}: anonymous clients allowed (loopback)" in text
    assert f"listener ws://0.0.0.0:{ws}/mqtt: every client refused: anonymous clients are not allowed" in text
    LClient(ws, cid("anon-ws"), websocket=True).connect(expect_rc=135)  # paho: CONNACK 0x05 as 0x87
    Client(broker.port, cid("anon-loopback")).connect()
    broker.wait_log("anonymous clients not allowed on ws://0.0.0.0:")
    (ws2,) = _ports(1)
    opened = start_broker("--listen", f"ws://0.0.0.0:{ws2}/mqtt", "--allow-anonymous", "on",
                          data_dir=str(tmp_path / "opened"))
    LClient(ws2, cid("anon-allowed"), websocket=True).connect()
    assert opened.pid != broker.pid


MQTTJS = """
const mqtt = require('mqtt'); const fs = require('fs');
const [url, ca] = [process.argv[2], process.argv[3]];
const opts = ca ? {ca: fs.readFileSync(ca), protocolVersion: 4} : {protocolVersion: 4};
const c = mqtt.connect(url, opts);
const fail = (e) => { console.log(JSON.stringify({error: String(e)})); process.exit(1); };
setTimeout(() => fail('timeout'), 10000);
c.on('error', fail);
c.on('connect', () => c.subscribe('js/echo', {qos: 1}, (err) => {
  if (err) fail(err);
  c.publish('js/echo', 'hello from MQTT.js', {qos: 1});
}));
c.on('message', (topic, payload) => {
  console.log(JSON.stringify({topic, payload: payload.toString()})); c.end(); process.exit(0);
});
"""


@pytest.fixture(scope="module")
def mqttjs() -> Path:
    """Node and the npm package ``mqtt`` (MQTT.js), installed once into a temporary directory."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("needs node and npm (scripts/test installs nodejs and npm)")
    d = Path(tempfile.gettempdir()) / f"brokerd-mqttjs-{os.getuid()}"
    if not (d / "node_modules" / "mqtt").is_dir():
        d.mkdir(exist_ok=True)
        try:
            r = subprocess.run(["npm", "install", "--prefix", str(d), "--no-audit", "--no-fund", "mqtt@5"],
                               capture_output=True, text=True, timeout=180)
        except subprocess.TimeoutExpired:
            pytest.skip("npm could not fetch the mqtt package within 180 s")
        if r.returncode != 0:
            pytest.skip(f"npm could not fetch the mqtt package: {r.stderr.strip().splitlines()[-1:]}")
    (d / "echo.js").write_text(MQTTJS)
    return d


def test_mqttjs_in_node_over_ws_and_wss(start_broker, certs, mqttjs):
    ws, wss = _ports(2)
    start_broker("--listen", f"ws://127.0.0.1:{ws}/mqtt", "--listen", f"wss://127.0.0.1:{wss}/mqtt",
                 *_tls_args(certs), workers=2)
    for url, ca in ((f"ws://127.0.0.1:{ws}/mqtt", ""), (f"wss://127.0.0.1:{wss}/mqtt", certs["ca.pem"])):
        r = subprocess.run(["node", str(mqttjs / "echo.js"), url, ca], capture_output=True, text=True,
                           timeout=30, cwd=mqttjs)
        assert r.returncode == 0, (url, r.stdout, r.stderr)
        assert json.loads(r.stdout.strip().splitlines()[-1]) == {"topic": "js/echo",
                                                                 "payload": "hello from MQTT.js"}


def test_a_listeners_max_connections_refuses_beyond_it_while_other_listeners_accept(xprocess, tmp_path):
    """[[listener]] max_connections = 2 with one worker: the third client on that listener gets
    CONNACK 0x89 server busy (MQTT 5; 3.1.1: 0x03), counted; the node's other listener still
    accepts, and a place freed on the limited listener is taken again."""
    port, limited = _ports(2)
    toml = tmp_path / "listeners.toml"
    toml.write_text(f'listen = "127.0.0.1:{port}"\n\n[[listener]]\nlisten = "mqtt://127.0.0.1:{limited}"\n'
                    'max_connections = 2\n')
    # Not start_broker: its --listen would replace the file's listeners. One worker: each worker
    # takes its share of a listener's max_connections, and the kernel picks the worker.
    broker = Broker(xprocess, f"brokerd-lim-{port}", ["--workers", "1", "--node-id", "t", "--data-dir",
                    str(tmp_path / "data"), "--config", str(toml), "--stats-interval", "0.2"], "127.0.0.1", port)
    broker.start()
    try:
        _listener_limit(broker, limited)
    finally:
        xprocess.getinfo(broker.name).terminate(timeout=15)


def _listener_limit(broker: Broker, limited: int) -> None:
    assert "at most 2 clients" in broker.log_text()
    first, second = (Client(limited, cid("lim"), protocol=mqtt.MQTTv5).connect() for _ in range(2))
    Client(limited, cid("lim"), protocol=mqtt.MQTTv5).connect(expect_rc=0x89)
    Client(limited, cid("lim")).connect(expect_rc=0x88)  # MQTT 3.1.1's 0x03, as paho reports it
    others = [Client(broker.port, cid("other")).connect() for _ in range(3)]
    assert "at its max_connections (2: 2 per worker)" in broker.log_text()
    first.disconnect()
    third = Client(limited, cid("lim")).connect()
    third.subscribe("lim/#", 1)
    others[0].publish("lim/x", b"through", 1)
    assert third.wait_messages(1)[0].payload == b"through"
    out = subprocess.run([BROKERD, "stats", "--json", "--node-id", "t", "--listen", f"127.0.0.1:{broker.port}",
                          "--stats-interval", "0.2", "--workers", "1"], capture_output=True, text=True, timeout=30)
    (snap,) = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert snap["limits"]["listener_connections"] == 2 and snap["clients"]["refused_total"] == 2
    Client.close_all([second, third, *others])


def _served_cn(port: int, ca: str) -> str:
    """The common name of the certificate the TLS listener on ``port`` serves (verified against ``ca``)."""
    ctx = ssl.create_default_context(cafile=ca)
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        cert = tls.getpeercert()
    return {k: v for rdn in cert["subject"] for k, v in rdn}["commonName"]


def test_sighup_reloads_the_tls_certificate_for_new_connections(start_broker, certs, tmp_path):
    """SIGHUP to the supervisor: every worker loads the certificate files again. New connections get the
    new certificate, established ones stay; a bad file keeps the old certificate (an error logged)."""
    d = Path(certs["ca.pem"]).parent
    (tmp_path / "renewed.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=renewed", "-keyout", "renewed.key",
             "-out", "renewed.csr", cwd=tmp_path)
    _openssl("x509", "-req", "-in", "renewed.csr", "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
             "-CAcreateserial", "-days", "2", "-out", "renewed.pem", "-extfile", "renewed.ext", cwd=tmp_path)
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copyfile(certs["server.pem"], cert)
    shutil.copyfile(certs["server.key"], key)
    (tls,) = _ports(1)
    broker = start_broker("--listen", f"mqtts://127.0.0.1:{tls}", "--certfile", str(cert), "--keyfile", str(key),
                          "--cafile", certs["ca.pem"], workers=2)
    ca = certs["ca.pem"]
    assert _served_cn(tls, ca) == "localhost"
    before = LClient(tls, cid("before"), tls={"ca_certs": ca}).connect()
    before.subscribe("tls/#", 1)
    # A half-written certificate: the old one stays in use.
    cert.write_text("-----BEGIN CERTIFICATE-----\nnot a certificate\n")
    os.kill(broker.pid, signal.SIGHUP)
    broker.wait_log("TLS files not reloaded")
    assert all(_served_cn(tls, ca) == "localhost" for _ in range(4))
    shutil.copyfile(tmp_path / "renewed.pem", cert)
    shutil.copyfile(tmp_path / "renewed.key", key)
    os.kill(broker.pid, signal.SIGHUP)
    broker.wait_log("TLS certificate reloaded")
    deadline = time.monotonic() + WAIT  # both workers (the kernel spreads new connections among them)
    while broker.log_text().count(f"mqtts://127.0.0.1:{tls}: TLS certificate reloaded") < 2:
        assert time.monotonic() < deadline, broker.log_text()
        time.sleep(0.05)
    assert {_served_cn(tls, ca) for _ in range(8)} == {"renewed"}
    after = LClient(tls, cid("after"), tls={"ca_certs": ca}).connect()
    after.publish("tls/x", b"renewed", 1)
    assert before.wait_messages(1)[0].payload == b"renewed" and not before.disconnected.is_set()
    assert "Traceback" not in broker.log_text()
    Client.close_all([before, after])


# -- issue 40, item 9: TLS and WebSocket sockets count, and are limited, from accept ---------------

def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the broker closes ``sock`` (which sends nothing) within ``seconds``."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _tls_connack(port: int, ca: str, level: int = 4) -> bytes:
    ctx = ssl.create_default_context(cafile=ca)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(connect_packet(cid("tls"), level=level))
            return s.recv(4)


def test_silent_sockets_on_tls_and_websocket_listeners_count_and_are_closed_after_10_s(start_broker, certs):
    """Sockets that never start their TLS handshake (or WebSocket upgrade) count under
    --max-connections from accept, as plain ones not yet CONNECTed do: a real TLS client beyond
    the limit gets CONNACK 0x03. They are closed after the 10 s handshake timeout (the loop's own
    was 60 s), and the client gets in then."""
    tls, ws = _ports(2)
    # One worker: each worker takes its share of --max-connections.
    start_broker("--listen", f"mqtts://127.0.0.1:{tls}", "--listen", f"ws://127.0.0.1:{ws}/mqtt",
                 "--max-connections", "3", *_tls_args(certs), workers=1)
    assert _tls_connack(tls, certs["ca.pem"]) == b"\x20\x02\x00\x00"  # room while none is held
    start = time.monotonic()
    silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for port in (tls, tls, ws)]
    time.sleep(0.3)  # accepted by the worker
    assert _tls_connack(tls, certs["ca.pem"]) == b"\x20\x02\x00\x03"  # 3 held: server unavailable
    for s in silent:
        assert _closed_within(s, 12.5 - (time.monotonic() - start)), "a silent socket held beyond 12 s"
        s.close()
    assert time.monotonic() - start > 9.0  # held for the timeout, not closed at once
    wait_for(lambda: _tls_connack(tls, certs["ca.pem"]) == b"\x20\x02\x00\x00", what="room once they closed")


def test_the_connection_rate_closes_tls_sockets_before_their_handshake(start_broker, certs):
    """--max-connection-rate applies at accept on a TLS listener too: the silent sockets beyond the
    rate are closed at once, not after a handshake that never comes."""
    (tls,) = _ports(1)
    broker = start_broker("--listen", f"mqtts://127.0.0.1:{tls}", "--max-connection-rate", "5",
                          *_tls_args(certs), workers=1)
    socks = [socket.create_connection(("127.0.0.1", tls), timeout=5) for _ in range(20)]
    try:
        closed = sum(_closed_within(s, 0.3) for s in socks)
        assert closed >= 10, f"only {closed} of 20 TLS sockets beyond a rate of 5/s were closed at once"
    finally:
        for s in socks:
            s.close()
    assert broker.workers()


def test_silent_tls_sockets_count_against_their_listeners_max_connections(xprocess, tmp_path, certs):
    """[[listener]] max_connections = 2 on a TLS listener: two sockets still in (or before) their
    handshake hold its places, so a real client there gets CONNACK 0x03; the node's other listener
    is not affected."""
    port, limited = _ports(2)
    toml = tmp_path / "listeners.toml"
    toml.write_text(f'listen = "127.0.0.1:{port}"\n\n[[listener]]\nlisten = "mqtts://127.0.0.1:{limited}"\n'
                    'max_connections = 2\n')
    # Not start_broker: its --listen would replace the file's listeners. One worker: each worker
    # takes its share of a listener's max_connections.
    broker = Broker(xprocess, f"brokerd-tlslim-{port}", ["--workers", "1", "--node-id", "t", "--data-dir",
                    str(tmp_path / "data"), "--config", str(toml), *_tls_args(certs)], "127.0.0.1", port)
    broker.start()
    try:
        silent = [socket.create_connection(("127.0.0.1", limited), timeout=5) for _ in range(2)]
        time.sleep(0.3)  # accepted by the worker
        assert _tls_connack(limited, certs["ca.pem"]) == b"\x20\x02\x00\x03"
        Client(port, cid("other")).connect()
        for s in silent:
            s.close()
        wait_for(lambda: _tls_connack(limited, certs["ca.pem"]) == b"\x20\x02\x00\x00",
                 what="a place on the listener once the silent sockets closed")
    finally:
        xprocess.getinfo(broker.name).terminate(timeout=15)
