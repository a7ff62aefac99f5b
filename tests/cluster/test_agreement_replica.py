"""One PySyncObj member (a cluster of one, on 127.0.0.1, in this process): what its replica tells
the node's service (the records an entry changed) and what its snapshot keeps."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("brokerd.cluster.agreement.raft")

from brokerd.cluster.agreement import state as S  # noqa: E402
from brokerd.cluster.agreement.raft import Agreement  # noqa: E402
from brokerd.cluster.agreement.state import SESSION  # noqa: E402
from tests.helpers import free_port, wait_for  # noqa: E402

PASSWORD = "test-replica-password-0123456789"
COMMIT = 10.0


def test_each_entry_reports_the_records_it_changed_in_log_order_moves_and_releases_only():
    batches: list[list[list]] = []
    applied = threading.Event()

    def changed(records: list[list]) -> None:
        batches.append(records)
        applied.set()

    m = Agreement(f"127.0.0.1:{free_port()}", [], PASSWORD, on_changed=changed)
    try:
        m.propose_wait([S.move(SESSION, "c1", None, 0, "a/0"), S.move(SESSION, "c2", None, 0, "a/0"),
                        S.get(SESSION, "c1")], COMMIT)
        m.propose_wait([S.move(SESSION, "c1", None, 0, "b/0"),  # stale: changes nothing
                        S.all_of([S.move(SESSION, "c1", "a/0", 1, "b/0"), S.release(SESSION, "c2", "a/0", 2)]),
                        S.join("a", "h:1", 1)], COMMIT)
        m.propose_wait([S.all_of([S.move(SESSION, "c3", None, 0, "b/0"), S.move(SESSION, "c1", "a/0", 1, "x")])],
                       COMMIT)  # a transaction that fails: undone, nothing changed
        m.propose_wait([["move", SESSION, "c4", None, 0, "c/0"]], COMMIT)  # as msgpack brings it
        wait_for(lambda: len(batches) == 3, COMMIT, "three reports")
    finally:
        m.close()
    assert batches == [[[SESSION, "c1", "a/0", 1], [SESSION, "c2", "a/0", 2]],
                       [[SESSION, "c1", "b/0", 3], [SESSION, "c2", None, 0]],
                       [[SESSION, "c4", "c/0", 4]]]


def test_a_member_restored_from_its_snapshot_holds_the_agreed_state(tmp_path):
    """Log compaction leaves the journal a snapshot and no entries: the state must be in it."""
    address = f"127.0.0.1:{free_port()}"
    m = Agreement(address, [], PASSWORD, data_dir=str(tmp_path))
    try:
        m.propose_wait([S.move(SESSION, "c1", None, 0, "a/0"), S.join("a", "h:1", 5)], COMMIT)
        m._replica.forceLogCompaction()
        wait_for(lambda: m._replica.getStatus()["log_len"] <= 2, COMMIT, "the log compacted")
    finally:
        m.close()
    again = Agreement(address, [], PASSWORD, data_dir=str(tmp_path))
    try:
        wait_for(lambda: again.state.owner(SESSION, "c1") == ("a/0", 1), COMMIT, "the state restored")
        assert again.state.members == {"a": ("h:1", 5)}
        assert again.propose_wait([S.move(SESSION, "c1", "a/0", 1, "b/0")], COMMIT) == [("ok", "b/0", 2)]
    finally:
        again.close()
