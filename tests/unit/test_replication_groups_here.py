"""A silent router's replica held by this router itself, read back to the shared groups
(``ReadBackPart.parked``, issue 41, partition seed 713). The read-back to this router's own
subscribers runs its first step at once and raises the silent router's mark to the replica's end
(``replayed``: as if a holder elsewhere had sent it); the groups' read took the mark after that,
from the end, and sent nothing. Seed 713: b/w0's copies of a group chosen for a/w0 were lost with
a connection during an a-b cut, b/w0 was killed before it sent them again, and a/w0, which held
b/w0's replica, read it back from 83 to its own subscribers but gave the groups nothing from 83:
four acknowledged messages reached no member. A real replica log in a temporary folder, a fake
router and mesh, a loop run by hand."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from brokerd.cluster.replication.link import HERE
from brokerd.cluster.replication.read_back import ReadBackPart
from brokerd.router.log.commitlog import CommitLog
from tests.unit.test_mesh_catchup_groups import Loop  # (call_soon collected, run by drain)

DEAD = "b/w0"


class Router:
    """What the read-back uses of a router: its subscriptions (one matching every topic), its
    delivery of what is read back, and the groups."""

    has_shared = True

    def __init__(self) -> None:
        self.delivered: list[bytes] = []
        self.to_the_groups: list[bytes] = []
        self.subs = SimpleNamespace(match=lambda topic: ["a subscriber"])

    def deliver_forwarded(self, batch: list, sender: str) -> int:
        self.delivered += [bytes(values[1]) for values in batch]
        return 0

    def to_groups(self, msg: Any) -> int:
        self.to_the_groups.append(bytes(msg.payload))
        return 1


@pytest.fixture
def part(tmp_path):
    log = CommitLog(tmp_path, router_id="a/w0")
    silent = SimpleNamespace(router_id=DEAD, node_id="b", origin_mark=-1, alive=False, replicas={})
    p = ReadBackPart.__new__(ReadBackPart)
    p.loop = Loop()  # type: ignore[assignment]
    p.router = Router()  # type: ignore[assignment]
    p.config = SimpleNamespace(node_id="a")  # type: ignore[assignment]
    p.partition = "a/w0"
    p.follow = SimpleNamespace(replicas={DEAD: SimpleNamespace(log=log)})  # type: ignore[assignment]
    p.wills = SimpleNamespace(arm_wills=lambda router_id: None)  # type: ignore[assignment]
    p.isr = SimpleNamespace(in_sync_holders=lambda partition: ())  # type: ignore[assignment]
    p.net = SimpleNamespace(peers=lambda: [silent], peer=lambda rid: silent if rid == DEAD else None)  # type: ignore[assignment]
    p.groups_low, p.groups_high, p._groups_rising = {}, {}, set()
    yield p, log, silent
    log.close()


def replicate(log: CommitLog, first: int, last: int) -> None:
    for i in range(first, last):
        log.append("t", b"m%d" % i, qos=1, origin_router=DEAD, origin_offset=i)
    log.flush()


def test_the_groups_get_the_replica_here_from_the_mark_at_the_silence(part):
    p, log, silent = part
    replicate(log, 0, 6)
    silent.origin_mark = 3  # everything of b/w0's below 3 reached this router
    assert p.holder(DEAD)[0] is HERE
    p.parked(silent)
    p.loop.drain()  # type: ignore[attr-defined]
    assert p.router.delivered == [b"m3", b"m4", b"m5"]
    assert silent.origin_mark == 6  # (the read-back raised it)
    assert p.router.to_the_groups == [b"m3", b"m4", b"m5"], "the groups were read back from the raised mark"
