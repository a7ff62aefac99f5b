"""The cluster's own surfaces are closed by default: a mesh needs a key, loopback too (or the
operator's word), run directories are private and checked, and the data a broker keeps on disk
(segments, indexes, state.msgpack) is readable by its user alone."""

from __future__ import annotations

import os
import stat

import pytest

from brokerd.cluster.config import ConfigError, load
from brokerd.cluster.paths import private_dir
from tests.helpers import LEASES, Client


def test_a_mesh_needs_a_key_or_the_operators_word_loopback_too():
    for address in ("0.0.0.0:7000", "127.0.0.2:7000"):  # every local process reaches loopback
        with pytest.raises(ConfigError, match=f"--mesh: {address} needs --mesh-key FILE.*brokerd keygen"):
            load(["--mesh", address, *LEASES, "--listen", "127.0.0.1:1883"], environ={})
    assert load(["--mesh", "0.0.0.0:7000", *LEASES, "--mesh-insecure", "on"], environ={}).mesh_insecure
    assert load(["--mesh", "127.0.0.2:7000", *LEASES, "--mesh-key", "k.key_secret"], environ={}).mesh_key


def test_run_directories_are_private_and_checked(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    private_dir(str(loose))
    assert stat.S_IMODE(os.lstat(loose).st_mode) == 0o700  # ours: tightened
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    with pytest.raises(PermissionError, match="not a directory"):
        private_dir(str(link))
    if os.getuid() == 0:  # only root can hand a directory to another user
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(PermissionError, match="belongs to uid 65534"):
            private_dir(str(theirs))


def test_what_a_broker_keeps_on_disk_is_its_users_alone(start_broker, tmp_path):
    broker = start_broker("--fsync", "always", data_dir=str(tmp_path / "data"))
    sub = Client(broker.port, "disk-sub", clean=False).connect()
    sub.subscribe("disk/#", 1)
    Client(broker.port, "disk-pub").connect().publish("disk/t", b"kept", qos=1)
    sub.wait_topic("disk/t")
    assert broker.stop() == 0  # writes state.msgpack
    # Every router keeps its own directory; the log segments are where messages went (a router
    # whose clients the kernel gave nothing to publish or receive may hold none).
    router_dirs = [tmp_path / "data" / "t" / f"w{i}" for i in range(2)]
    files = [p for d in router_dirs for p in d.iterdir() if p.is_file()]
    assert any(p.suffix == ".log" for p in files), files
    assert all((d / "state.msgpack").exists() for d in router_dirs), files
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, f"{p} is {oct(p.stat().st_mode)}"
    for d in (tmp_path / "data" / "t", *router_dirs):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, f"{d} is {oct(d.stat().st_mode)}"


def _get(url: str, *, auth: tuple[str, str] | None = None, ca: str | None = None) -> tuple[int, bytes]:
    import base64
    import ssl
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url)
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    ctx = ssl.create_default_context(cafile=ca) if ca else None
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_metrics_listen_on_loopback_unless_an_address_is_given(start_broker):
    import socket as socket_

    from tests.helpers import free_port, wait_for

    mport = free_port()
    broker = start_broker("--metrics-port", str(mport), host="0.0.0.0")
    wait_for(lambda: _get(f"http://127.0.0.1:{mport}/metrics")[0] == 200, what="/metrics on loopback")
    with pytest.raises(OSError), socket_.create_connection(("127.0.0.2", mport), timeout=5):
        pass  # the MQTT listener is on 0.0.0.0, /metrics only on 127.0.0.1
    assert broker.pid


def test_metrics_behind_basic_auth_and_tls(start_broker, tmp_path):
    import subprocess

    from tests.helpers import BROKERD, free_port, wait_for

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", "m.key", "-out",
                    "m.pem"], cwd=tmp_path, check=True, capture_output=True, timeout=60)
    pw = tmp_path / "metrics.passwd"
    subprocess.run([BROKERD, "passwd", str(pw), "prometheus"], input="scrape-secret\n", text=True,
                   check=True, capture_output=True, timeout=30)
    mport = free_port()
    broker = start_broker("--metrics-port", str(mport), "--metrics-password-file", str(pw),
                          "--metrics-certfile", str(tmp_path / "m.pem"), "--metrics-keyfile", str(tmp_path / "m.key"))
    url, ca = f"https://127.0.0.1:{mport}/metrics", str(tmp_path / "m.pem")
    wait_for(lambda: _get(url, ca=ca)[0] == 401, what="/metrics over TLS refusing a scrape without credentials")
    assert _get(url, auth=("prometheus", "wrong"), ca=ca)[0] == 401
    status, body = _get(url, auth=("prometheus", "scrape-secret"), ca=ca)
    assert status == 200 and b"brokerd_info" in body
    assert f"metrics https://127.0.0.1:{mport}/metrics (basic auth)" in broker.log_text()
    assert "scrape-secret" not in broker.log_text()


def test_stats_without_per_client_rows(start_broker):
    import json
    import subprocess

    from tests.helpers import BROKERD

    broker = start_broker("--stats-clients", "off", "--stats-interval", "0.2")
    Client(broker.port, "private-device-7").connect()
    r = subprocess.run([BROKERD, "stats", "--json", "--node-id", "t", "--listen", f"127.0.0.1:{broker.port}",
                        "--stats-interval", "0.2", "--workers", "2"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    snaps = [json.loads(line) for line in r.stdout.splitlines()]  # one per router: the client is on one
    assert len(snaps) == 2 and sum(s["clients"]["connected"] for s in snaps) == 1, r.stdout
    assert all(s["top"] == [] for s in snaps)
    assert "private-device-7" not in r.stdout
