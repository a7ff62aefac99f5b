"""Process safety as an operator meets it: SIGHUP, a killed supervisor, a second broker on the same
directory or port, options that are wrong, and what dead brokers leave in the run directory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import psutil
import pytest

from brokerd.cluster.paths import LOCK_FILE
from tests.cluster.conftest import client_worker
from tests.helpers import (
    BROKERD,
    LEASES,
    WAIT,
    Client,
    _alive,
    cid,
    free_port,
    mesh_key,
    wait_for,
    worker_pids,
)

FAIL_FAST_S = 20.0  # bound on a brokerd that must stop at start-up


def run_failing(*args: str) -> subprocess.CompletedProcess:
    """Run a brokerd that must stop at start-up, in a process group of its own. Whatever it forked
    and left running (the faults these tests are about) is killed, and counts as a failure."""
    proc = subprocess.Popen([BROKERD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=FAIL_FAST_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"brokerd {' '.join(args)} did not stop at start-up:\n{err}") from None
    finally:
        left = _group(proc.pid)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert not left, f"brokerd {' '.join(args)} left processes running: {left}\n{err}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _group(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    found = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return found


def one_line(r: subprocess.CompletedProcess) -> str:
    text = r.stderr.strip()
    assert "\n" not in text and "Traceback" not in text, text
    return text


def test_sighup_leaves_the_broker_serving_and_restarting_workers(start_broker):
    mport = free_port()
    broker = start_broker("--metrics-port", str(mport))
    children = psutil.Process(broker.pid).children()
    assert len(children) == 3, children  # the two workers and brokerd-stats
    for child in children:  # a hangup of the whole process group, one by one
        os.kill(child.pid, signal.SIGHUP)
    os.kill(broker.pid, signal.SIGHUP)
    broker.wait_log("SIGHUP: nothing to reload yet")
    # Each answers after the signal was delivered (it was pending before the request came): alive.
    Client(broker.port, "after-hup").connect()
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=WAIT) as resp:
        assert b"brokerd_info" in resp.read()
    assert _alive(broker.pid) and all(c.is_running() for c in children)
    assert "died" not in broker.log_text(this_run=True)

    before = worker_pids(broker.pid)
    victim = before[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(w := worker_pids(broker.pid)) == 2 and victim not in w, what="the worker restarted")
    broker.wait_log("restarting it")
    [restarted] = set(worker_pids(broker.pid)) - set(before)
    # The other worker served all along; the restarted one takes connections again: new clients
    # until the kernel gives it one (it spreads them over the listening workers; bounded).
    wait_for(lambda: client_worker(broker, Client(broker.port, cid("after-restart")).connect()) == restarted,
             what="a connection accepted by the restarted worker")


def test_workers_and_stats_process_die_with_a_killed_supervisor(start_broker):
    broker = start_broker("--metrics-port", str(free_port()), workers=2)
    children = psutil.Process(broker.pid).children()
    assert len(children) == 3, children  # two workers and brokerd-stats (it serves /metrics)
    try:
        os.kill(broker.pid, signal.SIGKILL)
        wait_for(lambda: not any(_alive(c.pid) for c in children), what="the workers and brokerd-stats to exit")
        for i in range(2):  # SIGTERM, their graceful stop: the commit log flushed and closed
            broker.wait_log(f"router t/w{i} stopped")
    finally:
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass


def test_a_second_broker_on_the_same_data_directory_stops_with_one_line(start_broker, tmp_path):
    data = str(tmp_path / "data")
    first = start_broker(data_dir=data)
    r = run_failing("--workers", "1", "--listen", f"127.0.0.1:{free_port()}", "--node-id", "t",
                    "--data-dir", data)
    assert r.returncode != 0
    assert one_line(r) == (f"brokerd: error: --data-dir: {os.path.join(data, 't')} is in use by brokerd pid "
                           f"{first.pid} (stop it first)")
    Client(first.port, "still-first").connect()


def test_the_agreement_journal_locks_the_data_directory_with_the_log_off(start_broker, tmp_path):
    # Two members sharing one journal would vote for each other: the lock holds without the log too.
    data = str(tmp_path / "data")
    first = start_broker("--log", "off", "--mesh", f"127.0.0.1:{free_port()}", *mesh_key(),
                         "--agreement", f"127.0.0.1:{free_port()}", data_dir=data)
    r = run_failing("--workers", "1", "--listen", f"127.0.0.1:{free_port()}", "--node-id", "t", "--log", "off",
                    "--data-dir", data, "--mesh", f"127.0.0.1:{free_port()}", *mesh_key(),
                    "--agreement", f"127.0.0.1:{free_port()}")
    assert r.returncode != 0
    assert one_line(r) == (f"brokerd: error: --data-dir: {os.path.join(data, 't')} is in use by brokerd pid "
                           f"{first.pid} (stop it first)")
    Client(first.port, "still-first").connect()


def test_a_port_or_node_a_broker_serves_stops_a_second_broker_with_one_line(start_broker, tmp_path):
    mesh = free_port()
    first = start_broker("--log", "off", "--mesh", f"127.0.0.1:{mesh}", *LEASES, *mesh_key())
    common = ("--workers", "1", "--log", "off", "--data-dir", str(tmp_path / "other"))

    r = run_failing(*common, "--listen", f"127.0.0.1:{first.port}", "--node-id", "t")
    assert r.returncode != 0
    assert one_line(r) == f"brokerd: error: --listen: 127.0.0.1:{first.port} is already in use (another broker running?)"

    r = run_failing(*common, "--listen", f"127.0.0.1:{free_port()}", "--node-id", "u",
                    "--mesh", f"127.0.0.1:{mesh}", *LEASES, *mesh_key())
    assert r.returncode != 0
    assert one_line(r) == f"brokerd: error: --mesh: 127.0.0.1:{mesh} is already in use (another broker running?)"

    # The same node and port on another address: the run directory (its ipc sockets) is the first one's.
    r = run_failing(*common, "--listen", f"127.0.0.2:{first.port}", "--node-id", "t")
    assert r.returncode != 0
    assert one_line(r) == (f"brokerd: error: --node-id: node t with MQTT port {first.port} is in use by "
                           f"brokerd pid {first.pid} (stop it first)")
    Client(first.port, "still-first").connect()


@pytest.mark.parametrize("args, option", [
    (["--metrics-port", "70000"], "--metrics-port"),
    (["--stats-port", "65535", "--workers", "2"], "--stats-port"),
    (["--mesh", "127.0.0.1:65535", *LEASES, "--workers", "2"], "--mesh"),
    (["--stats-interval", "0"], "--stats-interval"),
])
def test_a_wrong_option_stops_startup_before_anything_forks(tmp_path, args, option):
    r = run_failing("--workers", "1", "--listen", f"127.0.0.1:{free_port()}", "--node-id", "t",
                    "--data-dir", str(tmp_path / "data"), *args)
    assert r.returncode == 2
    assert one_line(r).startswith(f"brokerd: error: {option}: ")


def test_run_directories_of_dead_brokers_are_removed_and_live_ones_kept(start_broker, tmp_path, monkeypatch):
    base = tmp_path / "run"
    base.mkdir()
    monkeypatch.setenv("BROKERD_RUN_DIR", str(base))
    live = start_broker(node_id="live")
    live_dir = base / f"live-{live.port}"
    gone = _dead_pid()
    stale = _run_dir(base / "t-1", gone, "w0.mesh", "w0.stats")
    port = free_port()
    own = _run_dir(base / f"t-{port}", gone, "w7.stats")  # a router the new broker does not have
    legacy = _run_dir(base / "old-2", None, "w0.mesh")  # no lock file: not this version's to judge

    broker = start_broker(port=port)
    assert not stale.exists()
    assert not (own / "w7.stats").exists()
    assert (own / LOCK_FILE).read_text().strip() == str(broker.pid)
    assert (legacy / "w0.mesh").exists()
    assert (live_dir / "w0.stats").exists() and (live_dir / LOCK_FILE).read_text().strip() == str(live.pid)
    Client(live.port, "live").connect()

    assert broker.stop() == 0
    assert not own.exists()  # a clean stop leaves nothing behind


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    return proc.pid


def _run_dir(path: Path, holder: int | None, *sockets: str) -> Path:
    """A run directory as a broker killed with SIGKILL leaves it: its lock file and ipc sockets."""
    path.mkdir(mode=0o700)
    if holder is not None:
        (path / LOCK_FILE).write_text(f"{holder}\n")
    for name in sockets:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path / name))
    return path


@pytest.mark.parametrize("argv, message", [
    (["--port", "0"], "--port: must be a port number (1-65535), got 0"),
    (["--mesh", "127.0.0.1:7000", *LEASES, "--peer", "127.0.0.1:0"], "--peer: must be a port number (1-65535)"),
    (["--listen", "127.0.0.1:1883", "--mesh", "0.0.0.0:1882", *LEASES, "--workers", "2"],
     "--mesh: port 1883 is also used by --listen"),
    (["--listen", "0.0.0.0:1883", "--metrics-port", "1883"], "--metrics-port: port 1883 is also used by --listen"),
    (["--sys-interval", "-1"], "--sys-interval: must be at least 0"),
])
def test_option_rules_between_and_within_options(argv, message):
    """The same rules without a process: each has one home (an option's check, or load's)."""
    from brokerd.cluster.config import ConfigError, load

    with pytest.raises(ConfigError) as err:
        load(argv)
    assert str(err.value).startswith(message), str(err.value)
    # other addresses
    load(["--listen", "127.0.0.2:1883", "--mesh", "127.0.0.1:1883", *LEASES, *mesh_key(), "--workers", "2"])
