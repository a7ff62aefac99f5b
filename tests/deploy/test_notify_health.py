"""What systemd and the container probes see of a real brokerd: sd_notify READY=1 once it serves and
STOPPING=1 when it stops (NOTIFY_SOCKET bound by the test), and `brokerd health`'s exit status, on
every kind of listener (TLS and WebSocket ones with real certificates, made here with openssl)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import BROKERD, WAIT, Broker, RawClient, connect_packet, free_port

HEALTH_S = 15  # bound of one `brokerd health` run (Python's start-up included)


def health(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BROKERD, "health", *args], capture_output=True, text=True, timeout=HEALTH_S)


def test_sd_notify_ready_and_stopping_and_health(tmp_path):
    port = free_port()
    with tempfile.TemporaryDirectory(dir="/tmp") as d, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        path = os.path.join(d, "notify")  # short: a unix socket path must fit 107 bytes
        notify.bind(path)
        notify.settimeout(30)
        env = {**os.environ, "NOTIFY_SOCKET": path, "PYTHONUNBUFFERED": "1"}
        with open(tmp_path / "brokerd.log", "wb") as log:
            proc = subprocess.Popen(
                [BROKERD, "--workers", "1", "--listen", f"127.0.0.1:{port}", "--node-id", "notify", "--log", "off",
                 "--sys-interval", "0", "--max-connections", "2"],
                env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            ready = notify.recv(4096).decode()
            assert ready.startswith("READY=1\n") and f"127.0.0.1:{port}" in ready, ready
            # Ready means ready: a client connects at once.
            ok = health("--listen", f"127.0.0.1:{port}")
            assert ok.returncode == 0 and "ok" in ok.stdout, ok.stderr

            # At --max-connections the CONNECT is refused: unhealthy for a readiness probe.
            held = [RawClient(port) for _ in range(2)]
            for i, raw in enumerate(held):
                raw.send(connect_packet(f"held-{i}"))
                assert raw.recv_exact(4) == b"\x20\x02\x00\x00"
            full = health("--port", str(port))  # --port P: 127.0.0.1:P
            assert full.returncode == 1 and "server unavailable" in full.stderr, full.stderr
            for raw in held:
                raw.close()

            proc.send_signal(signal.SIGTERM)
            assert notify.recv(4096) == b"STOPPING=1"
            assert proc.wait(WAIT + 5) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_health_fails_on_a_closed_port_and_on_a_port_that_does_not_answer():
    closed = health("--listen", f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert closed.returncode == 1 and "refused" in closed.stderr.lower(), closed.stderr
    with socket.socket() as mute:  # accepts (the kernel's backlog), never answers: a hung broker
        mute.bind(("127.0.0.1", 0))
        mute.listen(4)
        hung = health("--listen", f"127.0.0.1:{mute.getsockname()[1]}", "--timeout", "0.5")
    assert hung.returncode == 1 and "no CONNACK within 0.5 s" in hung.stderr, hung.stderr
    bad = health("--listen", "nonsense")
    assert bad.returncode == 2 and "--listen" in bad.stderr


def test_health_counts_a_refused_anonymous_probe_as_up(start_broker):
    """On a listener that is not on loopback anonymous clients are refused (CONNACK 0x05): the
    probe is anonymous, and that answer still means the broker reads and answers CONNECTs."""
    broker = start_broker(host="0.0.0.0")
    r = health("--listen", f"0.0.0.0:{broker.port}")
    assert r.returncode == 0, r.stderr
    broker.wait_log("anonymous clients not allowed on mqtt://0.0.0.0:")


# -- the listener as configured: TLS, WebSockets --------------------------------------------------------

def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, str]:
    """A CA and a server certificate it signs (for localhost: the probe checks no names anyway), and a
    self-signed stranger."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    d = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=brokerd test CA",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "server.key",
             "-out", "server.csr", cwd=d)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-out", "server.pem", cwd=d)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=stranger",
             "-keyout", "stranger.key", "-out", "stranger.pem", cwd=d)
    return {n: str(d / n) for n in ("ca.pem", "server.pem", "server.key", "stranger.pem")}


@pytest.fixture
def node(xprocess, tmp_path) -> Iterator[Callable[..., Broker]]:
    """A brokerd with exactly the listeners given (start_broker always adds a plain one). One worker:
    these tests are about what the probe speaks, not about routing."""
    started: list[Broker] = []

    def start(name: str, *args: str) -> Broker:
        argv = ["--workers", "1", "--node-id", name, "--data-dir", str(tmp_path / name), "--log", "off",
                "--sys-interval", "0", *args]
        broker = Broker(xprocess, f"brokerd-health-{name}-{free_port()}", argv, "127.0.0.1", 0)
        started.append(broker)
        return broker.start()

    yield start
    for broker in started:
        info = xprocess.getinfo(broker.name)
        if info.isrunning():
            info.terminate(timeout=15)


def test_health_speaks_tls_to_a_node_whose_only_listener_is_tls(node, certs):
    """The image's health check on a TLS-only node: a TLS handshake, then CONNECT (it said "closed before
    CONNACK", exit 1, speaking plain MQTT to the TLS port). Then stopped: exit 1."""
    tls = ["--listen", f"mqtts://127.0.0.1:{free_port()}", "--certfile", certs["server.pem"],
           "--keyfile", certs["server.key"]]
    broker = node("tls", *tls)
    ok = health(*tls)
    assert ok.returncode == 0 and "mqtts://127.0.0.1:" in ok.stdout and "ok" in ok.stdout, ok.stderr
    verified = health(*tls, "--verify", certs["ca.pem"])
    assert verified.returncode == 0, verified.stderr
    wrong_ca = health(*tls, "--verify", certs["stranger.pem"])
    assert wrong_ca.returncode == 1 and "certificate verify failed" in wrong_ca.stderr, wrong_ca.stderr
    missing = health(*tls, "--verify", str(Path(certs["ca.pem"]).with_name("nowhere.pem")))
    assert missing.returncode == 2 and "--verify" in missing.stderr, missing.stderr

    assert broker.stop() == 0
    stopped = health(*tls, "--timeout", "1")
    assert stopped.returncode == 1 and "refused" in stopped.stderr.lower(), stopped.stderr


def test_health_speaks_websocket_to_a_node_whose_only_listener_is_ws_or_wss(node, certs):
    """An HTTP upgrade on the listener's path, then CONNECT in binary frames; over TLS too, where the
    listener requires a client certificate: the probe shows the node's own, which the CA signed."""
    ws = ["--listen", f"ws://127.0.0.1:{free_port()}/broker"]
    node("ws", *ws)
    ok = health(*ws)
    assert ok.returncode == 0 and "ws://127.0.0.1:" in ok.stdout and "/broker: ok" in ok.stdout, ok.stderr
    wrong_path = health("--listen", ws[1].replace("/broker", "/mqtt"))
    assert wrong_path.returncode == 1 and "WebSocket upgrade refused" in wrong_path.stderr, wrong_path.stderr

    wss = ["--listen", f"wss://127.0.0.1:{free_port()}/mqtt", "--certfile", certs["server.pem"],
           "--keyfile", certs["server.key"], "--cafile", certs["ca.pem"], "--require-certificate", "on"]
    node("wss", *wss)
    secure = health(*wss)
    assert secure.returncode == 0 and "wss://127.0.0.1:" in secure.stdout, secure.stderr


def test_health_states_its_exit_codes_once_and_everywhere():
    """0 healthy, 1 not healthy, 2 bad options: --help, README, docs/operations.md and the Dockerfile say so."""
    from brokerd.cluster.health import EXIT_STATUS
    from tests.helpers import ROOT

    shown = subprocess.run([BROKERD, "health", "--help"], capture_output=True, text=True, timeout=HEALTH_S)
    assert shown.returncode == 0 and EXIT_STATUS in " ".join(shown.stdout.split()).lower(), shown.stdout
    for doc in ("README.md", "docs/operations.md", "deploy/Dockerfile", "deploy/README.md"):
        text = " ".join((ROOT / doc).read_text().replace("#", " ").split())
        assert EXIT_STATUS in text, doc
