"""Two persistent sessions with one filter move to one router together (partition seed 363):
the second finds the filter that router's already and waits for no announcement; a message that
reached their old router after the second was exported, published before the publisher's router
took the filter in for the new one, is handed on and delivered, not taken for a copy that came
directly. Three routers in one event loop with their logs and real ZeroMQ sockets (ipc in a
temporary run directory), as tests/unit/test_mesh.py has two."""

from __future__ import annotations

import asyncio

import pytest

from brokerd.cluster.config import Config
from brokerd.cluster.mesh import Mesh
from brokerd.connection.batching import EndOfTick
from brokerd.connection.packets import Subscription
from brokerd.router.client import Client
from brokerd.router.connecting import Connecting
from brokerd.router.log.commitlog import CommitLog
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from tests.unit.conftest import FakeConn
from tests.unit.test_mesh import _payloads, _until, run_dir  # noqa: F401  (run_dir: the fixture)


async def _three(tmp_path) -> tuple[list[Router], list[Mesh]]:
    config = Config(workers=3, node_id="u", listen=("127.0.0.1", 1), mesh_timeout=1.0)
    loop = asyncio.get_running_loop()
    routers = [Router(RouterConfig(router_id=f"u/w{i}", node_id="u")) for i in range(3)]
    for i, r in enumerate(routers):
        r.attach_log(CommitLog(tmp_path / "data" / f"w{i}", router_id=r.router_id, loop=loop), False)
    meshes = [Mesh(config, i, r, loop, EndOfTick(loop)) for i, r in enumerate(routers)]
    for r, m in zip(routers, meshes, strict=True):
        r.attach_mesh(m)
    await asyncio.wait_for(asyncio.gather(*(m.start() for m in meshes)), 10)
    return routers, meshes


async def _import(router: Router, client_id: str, state: dict) -> None:
    """The new owner's side of a CONNECT that took the session over: take it in, wait for its
    announcement (if any), confirm (``Connecting._import_announced``)."""
    client = Client(router, FakeConn())  # type: ignore[arg-type]  # (compiled, a Client is checked as one)
    client.client_id = client_id
    assert await Connecting(client)._import_announced(state) is None


@pytest.mark.usefixtures("run_dir")
def test_a_session_moved_with_a_filter_announced_for_another_gets_what_reached_its_old_router(tmp_path):
    async def main() -> None:
        (a, b, c), meshes = await _three(tmp_path)
        try:
            for cid in ("sc0", "sa0"):  # on a, offline, one filter; c wants none of it
                a.subscribe(a.new_session(cid, True), Subscription("chaos/#", 1))
            await asyncio.wait_for(asyncio.gather(*a.interest_pending.values()), 5)
            # sa0's CONNECT reached c first: a exports it (and keeps it subscribed until c confirms).
            sa0_state = await asyncio.wait_for(meshes[2].takeover("sa0"), 5)
            assert sa0_state is not None
            # b publishes; only a wants it: the copy a logs is sa0's to hand on, and sc0's queue's.
            logged = a.commit_log.next_offset  # type: ignore[union-attr]
            b.publish(Message("chaos/pb1/2", b"pb1:218", qos=1, client_id="pb1", origin_router=b.router_id))
            offset = b.commit_log.next_offset - 1  # type: ignore[union-attr]
            await _until(lambda: a.commit_log.next_offset > logged, "a's copy of pb1:218")  # type: ignore[union-attr]
            # sc0 moves to c: its import announces the filter, which b takes in after pb1:218.
            sc0_state = await asyncio.wait_for(meshes[2].takeover("sc0"), 5)
            assert sc0_state is not None
            await asyncio.wait_for(_import(c, "sc0", sc0_state), 5)
            assert not c.interest_pending and "chaos/#" in c.local_filters
            # sa0 is taken in now: the filter is c's already, nothing to wait for. As c stood in the
            # seed, it has seen b's log up to pb1:218 (every message of b below it that c's interest
            # matched is here: none), not beyond: b's next HELLO, whose claim would raise that,
            # comes within 0.5 s and had not yet.
            assert meshes[2].peers[b.router_id].origin_mark <= offset
            meshes[2].peers[b.router_id].origin_mark = offset
            await asyncio.wait_for(_import(c, "sa0", sa0_state), 5)
            conns = {cid: FakeConn() for cid in ("sc0", "sa0")}
            for cid, conn in conns.items():
                c.sessions[cid].attach(conn)  # type: ignore[arg-type]
            await _until(lambda: not {"sc0", "sa0"} & a.sessions.keys(), "a letting both go")
            await _until(lambda: _payloads(conns["sc0"]) == [b"pb1:218"], "pb1:218 at c for sc0 (its queue)")
            await _until(lambda: _payloads(conns["sa0"]) == [b"pb1:218"], "pb1:218 handed on to sa0 at c")
        finally:
            await asyncio.gather(*(m.stop() for m in meshes))
            for r in (a, b, c):
                r.commit_log.close()  # type: ignore[union-attr]

    asyncio.run(main())
