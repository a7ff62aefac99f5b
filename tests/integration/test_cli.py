"""The command line: --help, --version, TOML config, one-line errors that name the option."""

from __future__ import annotations

import subprocess

from cluster.config import OPTIONS
from tests.helpers import BROKERD, Client, free_port


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([BROKERD, *args], capture_output=True, text=True, timeout=timeout)


def test_help_documents_every_option_with_its_default():
    out = run("--help").stdout
    for opt in OPTIONS:
        assert opt.flag in out, opt.flag
    assert "default: interval" in out and "--config" in out and "--port" in out


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("brokerd ")


def test_bad_value_stops_startup_with_one_line_naming_the_option():
    r = run("--workers", "0")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--workers" in r.stderr
    r = run("--fsync", "sometimes")
    assert r.returncode == 2 and "--fsync" in r.stderr and r.stderr.strip().count("\n") == 0
    r = run("--no-such-option")
    assert r.returncode == 2 and "--no-such-option" in r.stderr


def test_toml_unknown_key_and_bad_value(tmp_path):
    cfg = tmp_path / "b.toml"
    cfg.write_text('wrokers = 2\n')
    r = run("--config", str(cfg))
    assert r.returncode == 2 and "wrokers" in r.stderr
    cfg.write_text('max_inflight = "many"\n')
    r = run("--config", str(cfg))
    assert r.returncode == 2 and "max_inflight" in r.stderr


def test_listen_address_in_use_is_a_clear_error():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    r = run("--listen", f"127.0.0.1:{port}", "--workers", "1", "--log", "off")
    s.close()
    assert r.returncode != 0 and "--listen" in r.stderr


def test_options_from_toml_file(xprocess, tmp_path):
    from tests.helpers import Broker

    port = free_port()
    cfg = tmp_path / "brokerd.toml"
    cfg.write_text(f'listen = "127.0.0.1:{port}"\nworkers = 1\nmax_queued = 3\nlog = "off"\n'
                   f'data_dir = "{tmp_path}/d"\n')
    broker = Broker(xprocess, f"brokerd-toml-{port}", ["--config", str(cfg)], "127.0.0.1", port).start()
    try:
        c = Client(port, "toml-client").connect()
        c.subscribe("t", 0)
    finally:
        xprocess.getinfo(broker.name).terminate(timeout=15)


def test_sigterm_is_a_graceful_stop_with_exit_0(start_broker):
    broker = start_broker()
    Client(broker.port, "bye").connect()
    assert broker.stop() == 0
