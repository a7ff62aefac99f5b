"""The partition test's own readers, without namespaces or brokers: a process's TCP sockets read
from its /proc entry (what finds a node's workers in their namespace), and the one-line summary
scripts/partition prints per seed."""

from __future__ import annotations

import os
import socket

from tests.chaos.harness import Report
from tests.partition.netns import tcp_sockets
from tests.partition.test_partition import summary


def test_tcp_sockets_finds_a_listener_and_both_ends_of_a_connection_of_this_process() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            server, _ = listener.accept()
            with server:
                mine = tcp_sockets(os.getpid())
                local = client.getsockname()[1]
                assert (port, 0, "0A") in mine
                assert any(lp == port and rp == local and st == "01" for lp, rp, st in mine)
                assert any(lp == local and rp == port for lp, rp, _ in mine)
    assert tcp_sockets(2**22 + 1) == []  # no such process


def test_the_summary_counts_what_was_violated() -> None:
    assert summary(5, Report("line")) == "partition seed=5 passed"
    report = Report("line", violations=[
        "sa0: lost 18 of 1562 acknowledged messages (by publisher {'pc0': 9})",
        "sa1: lost 4 of 391 acknowledged messages (by publisher {'pc0': 2})",
        "sb1 (persistent, a) reconnected at 8.61 s with session present = 0",
        "interest tables do not match the live subscriptions after the faults: ...",
        "node a: 1 traceback(s) in its log, the first: ...",
    ])
    assert summary(2, report) == ("partition seed=2 FAILED lost=22 (subscribers 2) empty-sessions=1 "
                                  "not-converged=1 other=1")
