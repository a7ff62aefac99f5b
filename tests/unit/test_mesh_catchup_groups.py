"""A restarted router's catch-up and the shared groups (issue 41, partition seed 505): the group
copies it had chosen for a router cut off one way died with it in its ring; the catch-up that
router asks for reads the log back by its plain interest alone. So a router of a group asking
from an offset has the restarted router's own QoS 1/2 messages from there go to the groups again,
once per range. Values and fakes: a log in a temporary folder, a fake mesh, a loop run by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from brokerd.cluster.mesh.forwarding import ForwardingMixin
from brokerd.cluster.mesh.peer import Peer
from brokerd.router.log.commitlog import CommitLog
from brokerd.router.router import Router, RouterConfig
from tests.unit.conftest import FakeMesh

ME = "c/w1"
GROUP_ROUTER = "b/w1"
PLAIN_ROUTER = "a/w1"
KEY = "$share/g/t"


class Loop:
    """``call_soon`` collected, run by ``drain``."""

    def __init__(self) -> None:
        self.due: list[tuple[Callable[..., Any], tuple]] = []

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.due.append((fn, args))

    def drain(self) -> None:
        for _ in range(1000):
            if not self.due:
                return
            fn, args = self.due.pop(0)
            fn(*args)
        raise AssertionError("the loop never went idle")


class Forwarding(ForwardingMixin):
    """The mesh's forwarding part alone, over a router with a log."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.router_id = ME
        self.loop = Loop()  # type: ignore[assignment]
        self.closed = False


@pytest.fixture
def setup(tmp_path) -> tuple[Forwarding, FakeMesh, CommitLog]:
    mesh = FakeMesh()
    router = Router(RouterConfig(router_id=ME, node_id="c"), mesh)  # type: ignore[arg-type]
    log = CommitLog(tmp_path, router_id=ME)
    router.commit_log = log
    for i in range(6):  # this router's own messages: QoS 1, and every third QoS 0
        log.append("t", b"m%d" % i, qos=0 if i % 3 == 2 else 1, client_id="pc0")
    log.append("t", b"theirs", qos=1, origin_router="a/w0", origin_offset=7)  # another router's copy
    log.flush()
    router.shared.route_presence(KEY, GROUP_ROUTER, 1)
    yield Forwarding(router), mesh, log
    log.close()


def asked(forwarding: Forwarding, rid: str, offset: int) -> None:
    forwarding._on_catchup(Peer(rid, rid.split("/")[0], None, "tcp://x:1"), offset, 0)
    forwarding.loop.drain()  # type: ignore[attr-defined]


def test_a_group_routers_catchup_sends_the_own_qos1_messages_from_its_mark_to_the_groups(setup):
    forwarding, mesh, _ = setup
    asked(forwarding, GROUP_ROUTER, 2)
    assert mesh.only == [(GROUP_ROUTER, b"m3", [KEY]), (GROUP_ROUTER, b"m4", [KEY])]


def test_a_lower_mark_asked_later_extends_the_range_downwards_once(setup):
    forwarding, mesh, _ = setup
    asked(forwarding, GROUP_ROUTER, 3)
    asked(forwarding, GROUP_ROUTER, 4)  # within what went already: nothing again
    asked(forwarding, GROUP_ROUTER, 0)
    assert [payload for _, payload, _ in mesh.only] == [b"m3", b"m4", b"m0", b"m1"]


def test_a_router_of_no_group_asking_sends_nothing_to_the_groups(setup):
    forwarding, mesh, _ = setup
    asked(forwarding, PLAIN_ROUTER, 0)
    assert mesh.only == []
