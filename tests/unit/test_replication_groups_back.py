"""A silent router's replica read back to the shared groups (``ReadBackPart._groups_back``,
issue 41, partition seed 445): the holder of a dead router's replica sends its QoS 1/2 messages
to the groups from the lowest mark any router asked from. A router cut off from the dead one only
in part goes on replicating to the holder a while, so a later ask from above the first mark must
still send what the replica got since the first read reached its end (445: that ask returned at
once, and 64 acknowledged messages reached no group). A real replica log in a temporary folder,
a fake router, a loop run by hand."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from brokerd.cluster.replication.read_back import ReadBackPart
from brokerd.router.log.commitlog import CommitLog
from tests.unit.test_mesh_catchup_groups import Loop  # (call_soon collected, run by drain)

DEAD = "a/w1"


class Router:
    has_shared = True

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def to_groups(self, msg: Any) -> bool:
        self.sent.append(bytes(msg.payload))
        return True


@pytest.fixture
def part(tmp_path):
    log = CommitLog(tmp_path, router_id="c/w0")
    p = ReadBackPart.__new__(ReadBackPart)
    p.loop = Loop()  # type: ignore[assignment]
    p.router = Router()  # type: ignore[assignment]
    p.follow = SimpleNamespace(replicas={DEAD: SimpleNamespace(log=log)})  # type: ignore[assignment]
    p.groups_low, p.groups_high, p._groups_rising = {}, {}, set()
    yield p, log
    log.close()


def replicate(log: CommitLog, first: int, last: int) -> None:
    for i in range(first, last):
        log.append("t", b"m%d" % i, qos=1, origin_router=DEAD, origin_offset=i)
    log.flush()


def asked(p: ReadBackPart, offset: int) -> None:
    p._groups_back(DEAD, offset)
    p.loop.drain()  # type: ignore[attr-defined]


def test_a_later_ask_sends_what_the_replica_got_since_the_first_read(part):
    p, log = part
    replicate(log, 0, 4)
    asked(p, 2)
    assert p.router.sent == [b"m2", b"m3"]
    replicate(log, 4, 7)  # still replicating here while cut off from the asker
    asked(p, 5)  # a second ask, above the first mark
    assert p.router.sent[2:] == [b"m4", b"m5", b"m6"], "the replica's newer records reached no group"


def test_a_lower_mark_extends_downwards_and_nothing_goes_twice(part):
    p, log = part
    replicate(log, 0, 5)
    asked(p, 3)
    asked(p, 4)
    asked(p, 1)
    assert p.router.sent == [b"m3", b"m4", b"m1", b"m2"]


def test_heard_again_a_later_silence_reads_back_afresh(part):
    p, log = part
    replicate(log, 0, 3)
    asked(p, 1)
    p.forget_groups(DEAD)
    asked(p, 2)
    assert p.router.sent == [b"m1", b"m2", b"m2"]
