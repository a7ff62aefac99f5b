"""Fixtures shared by every test directory: real brokerd processes on free loopback ports."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator

import pytest

from tests.helpers import ROOT, Broker, Client, free_port

# Every process a test starts (brokerd, its CLI, Spark's Python workers) imports this checkout's
# packages, not those of whichever checkout a shared virtualenv's editable install points at
# (scripts/lib/pythonpath/README.md; pytest's ``pythonpath`` does the same for this process);
# the root, for ``tests.*``.
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(ROOT / "scripts" / "lib" / "pythonpath"), str(ROOT), os.environ.get("PYTHONPATH")]))

_names = itertools.count()
LOG_TAIL_LINES = 80  # of each broker's log, printed under a failed test's report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Keep each phase's report on the test item, so that fixtures can tell whether it failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _print_log_tails(brokers: list[Broker]) -> None:
    """A failed test's brokers: the end of each one's log (xprocess shows only the startup), so a
    failure seen once in CI says what the broker did meanwhile."""
    for broker in brokers:
        if broker.logfile is None:
            continue
        try:
            lines = broker.logfile.read_text(errors="replace").splitlines()
        except OSError:
            continue
        print(f"--- last {LOG_TAIL_LINES} lines of {broker.name}'s log ---")
        print("\n".join(lines[-LOG_TAIL_LINES:]))


def _close_clients_made() -> None:
    made, Client.made[:] = list(Client.made), []
    Client.close_all(made)


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    """Close every paho client a test made, once it is over (see ``Client.made``). Tests with a
    broker have theirs closed by ``start_broker`` first, while the broker still runs: paho's
    threads are then in select(), which their socket pair wakes, not asleep before a reconnect."""
    yield
    _close_clients_made()


def _free_port_not_in(host: str, args: tuple[str, ...]) -> int:
    """A free port that no argument names (``_ports`` of a test may have picked it for a listener
    it passes: two free ports asked for one after the other can be the same)."""
    while True:
        port = free_port(host)
        if not any(a.endswith(f":{port}") or f":{port}/" in a for a in args):
            return port


@pytest.fixture
def start_broker(xprocess, tmp_path, request) -> Iterator[Callable[..., Broker]]:
    """Start brokerd with the given arguments; every broker started is stopped after the test.

    Defaults: two workers (routers joined by the mesh, as brokerd is deployed: a test then also
    covers the forwarded path wherever the kernel puts its clients) on 127.0.0.1, a free port (not
    one the arguments name for another listener), the data directory in the test's tmp_path. A test
    passes ``workers=1`` only where one worker is what it is about, and says why. A node of a
    multi-node test (started with ``--peer``) has one worker unless it asks for more: those tests
    are about nodes (tests/cluster/test_faults.py counts a node's one worker).
    """
    started: list[Broker] = []

    def start(*args: str, workers: int | None = None, host: str = "127.0.0.1", port: int | None = None,
              data_dir: str | None = None, node_id: str = "t", prefix: list[str] | None = None) -> Broker:
        if workers is None:
            workers = 1 if "--peer" in args else 2
        port = port or _free_port_not_in(host, args)
        argv = ["--workers", str(workers), "--listen", f"{host}:{port}", "--node-id", node_id,
                "--data-dir", data_dir or str(tmp_path / "data"), *args]
        broker = Broker(xprocess, f"brokerd-{next(_names)}-{port}", argv, host, port, prefix=prefix or [])
        started.append(broker)
        return broker.start()

    yield start
    _close_clients_made()
    call = getattr(request.node, "report_call", None)
    if call is not None and call.failed:
        _print_log_tails(started)
    for broker in started:
        info = xprocess.getinfo(broker.name)
        if info.isrunning():
            info.terminate(timeout=15)


@pytest.fixture
def broker(start_broker) -> Broker:
    return start_broker()
