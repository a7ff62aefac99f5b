"""A member's connect attempts are bounded (``pysyncobj_fixes``, fix 4): a peer that answered no SYN
for a while is reached soon after it answers again, not at the kernel's next SYN retry.

The peer is a plain listening socket whose accept queue is full (backlog 0, one connection queued
and not accepted): the kernel drops every SYN that reaches it, as a cut link does, and answers
again once that connection is accepted."""

from __future__ import annotations

import os
import socket
import time

import pytest

# Through the project's module, which keeps the process's socket.inet_ntop (PySyncObj replaces it).
pytest.importorskip("brokerd.cluster.agreement.raft")

from brokerd.cluster.agreement.pysyncobj_fixes import CONNECT_ATTEMPT_S  # noqa: E402
from brokerd.cluster.agreement.raft import Agreement  # noqa: E402
from tests.helpers import free_port  # noqa: E402

PASSWORD = "test-" + os.urandom(16).hex()
# The peer drops SYNs this long after the member starts: between two of the kernel's SYN retries
# of an attempt made at the start, far from both (1, 2, 3, 4, 6, 10 s on Linux 6.5 and later,
# ``tcp_syn_linear_timeouts``; 1, 3, 7, 15 s before), so that without the bound the member
# connects 2.5 s (7.5 s) after the peer answers again.
SILENT_S = 7.5
BACK_S = CONNECT_ATTEMPT_S + 1.0  # from the peer's answering again to the member's connection


def _pair() -> tuple[str, int, str]:
    """(member address, peer port, peer address), the member's greater as a string: PySyncObj's
    member with the greater address is the one that connects."""
    while True:
        member, peer = free_port(), free_port()
        if f"127.0.0.1:{member}" > f"127.0.0.1:{peer}":
            return f"127.0.0.1:{member}", peer, f"127.0.0.1:{peer}"


def test_a_peer_that_answers_again_is_reached_at_the_next_attempt_not_the_next_syn_retry() -> None:
    member_address, peer_port, peer_address = _pair()
    listener = socket.socket()
    listener.bind(("127.0.0.1", peer_port))
    listener.listen(0)
    queued = socket.create_connection(("127.0.0.1", peer_port), timeout=5)  # the accept queue is full now
    member = Agreement(member_address, [peer_address], PASSWORD, election_timeout=(5.0, 6.0), heartbeat=0.05,
                       connect_timeout=6.0)
    try:
        time.sleep(SILENT_S)
        listener.accept()[0].close()  # ``queued`` leaves the queue: SYNs are answered again
        answering = time.monotonic()
        listener.settimeout(SILENT_S + 5.0)
        conn, _ = listener.accept()  # the member's connection
        took = time.monotonic() - answering
        conn.close()
        assert took < BACK_S, (f"the member connected {took:.1f} s after its peer answered again: a connect "
                               f"attempt waits for the kernel's SYN retries")
    finally:
        member.close()
        queued.close()
        listener.close()
