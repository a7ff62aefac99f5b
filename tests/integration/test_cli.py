"""The command line: --help, --version, TOML config, one-line errors that name the option."""

from __future__ import annotations

import re
import subprocess

from brokerd.cluster.config import OPTIONS
from tests.helpers import BROKERD, LEASES, Client, RawClient, connect_packet, free_port, mesh_key


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
        # Each option took effect: listen (we connect there), workers (one worker process, not the
        # default of one per CPU: so 1 here, where the tests' brokers have 2), log off
        # (no data directory made), max_queued (an offline session keeps 3 of 5 QoS 1 messages).
        assert len(broker.workers()) == 1
        assert not (tmp_path / "d").exists()
        sub = Client(port, "toml-sub", clean=False).connect()
        sub.subscribe("toml/t", 1)
        sub.disconnect()
        pub = Client(port, "toml-pub").connect()
        for i in range(5):
            pub.publish("toml/t", str(i), qos=1)
        pub.publish("toml/end", b"", qos=0)
        again = Client(port, "toml-sub", clean=False).connect()
        assert again.session_present
        got = again.wait_messages(3)
        probe = Client(port, "toml-probe").connect()
        probe.subscribe("toml/probe", 0)
        again.subscribe("toml/probe", 0)
        pub.publish("toml/probe", b"p", qos=0)
        again.wait_topic("toml/probe")  # everything queued came before it
        assert [m.payload for m in again.messages if m.topic == "toml/t"] == [b"0", b"1", b"2"] == [
            m.payload for m in got[:3]]
    finally:
        xprocess.getinfo(broker.name).terminate(timeout=15)


def test_sigterm_is_a_graceful_stop_with_exit_0(start_broker):
    broker = start_broker()
    Client(broker.port, "bye").connect()
    assert broker.stop() == 0


# -- operator experience: words, the ready line, logs ------------------------------------------------

def test_a_wrong_number_is_explained_in_an_operators_words():
    for args, words in ((["--workers", "abc"], "--workers: invalid value 'abc' (expected a whole number)"),
                        (["--port", "abc"], "--port: invalid value 'abc' (expected a whole number)"),
                        (["--mesh-timeout", "soon"], "--mesh-timeout: invalid value 'soon' (expected a number)"),
                        (["--segment-bytes", "lots"], "--segment-bytes: invalid value 'lots' (expected a size")):
        r = run(*args)
        assert r.returncode == 2 and words in r.stderr, r.stderr
        assert "literal" not in r.stderr and "int()" not in r.stderr and "float" not in r.stderr
        assert r.stderr.strip().count("\n") == 0


def test_choices_in_any_case():
    from brokerd.cluster.config import load

    config = load(["--log-level", "DEBUG", "--fsync", "Always"], environ={})
    assert (config.log_level, config.fsync) == ("debug", "always")


def test_ready_line_says_what_runs_and_where(start_broker, tmp_path):
    import os

    from brokerd.cluster import __version__
    from tests.cluster.test_multihost import mesh_port

    mport, metrics = mesh_port("127.0.0.1"), free_port()
    broker = start_broker("--mesh", f"127.0.0.1:{mport}", *LEASES, *mesh_key(), "--metrics-port", str(metrics),
                          "--fsync", "always", workers=2)
    line = next(x for x in broker.log_text().splitlines() if "brokerd ready" in x)
    for part in (f"brokerd {__version__}", "node t", f"MQTT on 127.0.0.1:{broker.port}", "2 workers",
                 f"data {os.path.join(tmp_path, 'data', 't')} (fsync always)", f"mesh on 127.0.0.1:{mport}",
                 f"metrics http://127.0.0.1:{metrics}/metrics", "stats ipc://"):
        assert part in line, (part, line)


def test_log_level_debug_in_capitals_is_accepted(start_broker):
    broker = start_broker("--log-level", "DEBUG", workers=2)
    # The mesh's line per router pair is DEBUG (INFO has one per node).
    broker.wait_log("DEBUG [t/w0] brokerd.cluster.mesh: mesh: router t/w1 joined")


def test_client_connects_and_disconnects_are_logged_nothing_per_message(start_broker):
    broker = start_broker()
    c = Client(broker.port, "operator-sees-me", keepalive=30).connect()
    c.subscribe("quiet/topic", 1)
    for _ in range(5):
        c.publish("quiet/topic", b"x", qos=1)
    c.wait_messages(5)
    c.disconnect()
    broker.wait_log("client operator-sees-me (127.0.0.1:")
    broker.wait_log(") disconnected (DISCONNECT)")
    text = broker.log_text()
    assert "client operator-sees-me connected from 127.0.0.1:" in text
    assert "(MQTT 3.1.1, clean start, keepalive 30)" in text
    assert "quiet/topic" not in text
    dropped = Client(broker.port, "dropped-one").connect()
    dropped.drop()
    broker.wait_log("client dropped-one (127.0.0.1:")
    broker.wait_log("disconnected (closed without DISCONNECT)")


def test_a_connect_storm_is_summarised_in_the_log_not_written_line_by_line(start_broker):
    """Each connect is a line, up to CONNECTION_LINES_PER_SECOND a second per worker; the rest of
    that second is one summary line, written when the second is over though no client connects
    after. Lines and summaries together count every connect. One worker: the quota is per
    worker."""
    from brokerd.connection.ratelimit import CONNECTION_LINES_PER_SECOND

    broker = start_broker(workers=1)
    n = CONNECTION_LINES_PER_SECOND * 3
    clients = [RawClient(broker.port) for _ in range(n)]
    try:
        for i, c in enumerate(clients):  # every CONNECT sent before any CONNACK is read: well under a second
            c.send(connect_packet(f"storm{i}"))
        for c in clients:
            assert c.recv_exact(4) == b"\x20\x02\x00\x00"
        broker.wait_log("more client connect and disconnect lines suppressed)")
        text = broker.log_text()
        written = len(re.findall(r"client storm\d+ connected from", text))
        suppressed = sum(int(x) for x in re.findall(r"\((\d+) more client connect and disconnect lines", text))
        assert written + suppressed == n and written <= 2 * CONNECTION_LINES_PER_SECOND, (written, suppressed)
    finally:
        for c in clients:
            c.sock.close()


def test_log_file_is_written_and_reopened_after_rename_and_sighup(start_broker, tmp_path):
    import os
    import signal

    from tests.helpers import wait_for

    path = tmp_path / "brokerd.log"
    broker = start_broker("--log-file", str(path), workers=2)
    assert "brokerd ready" in path.read_text()
    Client(broker.port, "before-rotation").connect().disconnect()
    wait_for(lambda: "client before-rotation (" in path.read_text(), what="the first client in the file")
    rotated = tmp_path / "brokerd.log.1"
    os.rename(path, rotated)  # logrotate: rename, then SIGHUP
    os.kill(broker.pid, signal.SIGHUP)
    wait_for(lambda: path.exists() and f"SIGHUP: log file {path} reopened" in path.read_text(),
             what="the supervisor to reopen the log file")
    for i in range(4):  # the workers (either one may take a client) reopen at their next line
        Client(broker.port, f"after-rotation-{i}").connect().disconnect()
    wait_for(lambda: path.read_text().count("after-rotation-") >= 8, what="the clients in the new file")
    assert "after-rotation" not in rotated.read_text()
    assert "client before-rotation connected" in rotated.read_text()
    assert "after-rotation" in broker.log_text()  # and stderr goes on as before


def test_log_file_that_cannot_be_opened_is_a_clear_error(tmp_path):
    r = run("--log-file", str(tmp_path / "no" / "such" / "dir" / "b.log"), "--log", "off")
    assert r.returncode == 2 and "--log-file: cannot open" in r.stderr and "No such file" in r.stderr


def test_mesh_joins_are_one_line_per_node(start_broker):
    from tests.cluster.test_multihost import mesh_port, wait_mesh_complete

    pa, pb = mesh_port("127.0.0.1"), mesh_port("127.0.0.2")
    a = start_broker("--mesh", f"127.0.0.1:{pa}", *LEASES, *mesh_key(), "--peer", f"127.0.0.2:{pb}", workers=2,
                     host="127.0.0.1", node_id="a")
    b = start_broker("--mesh", f"127.0.0.2:{pb}", *LEASES, *mesh_key(), "--peer", f"127.0.0.1:{pa}", workers=2,
                     host="127.0.0.2", node_id="b")
    wait_mesh_complete([a, b], routers=4)
    for me, other in ((a, "b"), (b, "a")):
        text = me.log_text()
        assert text.count(f"mesh: node {other} joined (first router {other}/w") == 1, text
        assert text.count(f"mesh: the 2 routers of node {me.args[me.args.index('--node-id') + 1]} joined") == 1
        assert " joined (" not in text.replace(f"mesh: node {other} joined (", "")  # each router pair: DEBUG


def test_log_help_and_config(start_broker, tmp_path):
    import json

    r = subprocess.run([BROKERD, "log", "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "tail" in r.stdout and "check" in r.stdout, r.stderr
    r = subprocess.run([BROKERD, "log"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "tail or check" in r.stderr
    data = tmp_path / "logdata"
    cfg = tmp_path / "brokerd.toml"
    cfg.write_text(f'data_dir = "{data}"\n')
    broker = start_broker("--config", str(cfg), data_dir=str(data))
    pub = Client(broker.port, "log-config").connect()
    for i in range(3):
        pub.publish("logcfg/t", f"m{i}".encode(), qos=1)
    r = subprocess.run([BROKERD, "log", "tail", "--config", str(cfg), "--from-beginning", "--json"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["payload"] for x in r.stdout.splitlines()] == ["m0", "m1", "m2"]
    r = subprocess.run([BROKERD, "log", "check", "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "all segments OK" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([BROKERD, "log", "check", "--config", str(tmp_path / "missing.toml")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--config: cannot read" in r.stderr
