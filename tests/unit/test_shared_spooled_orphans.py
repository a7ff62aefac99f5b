"""A clean start ends the session a takeover brought; the group copies that session had queued
come spooled on a router with a log (``router.spool``) and go to the group's other members, as the
ones it had in flight do (MQTT 5 4.8.2), not with the spool file."""

from __future__ import annotations

import asyncio

from brokerd.connection.packets import Subscription
from brokerd.router.log import CommitLog
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from brokerd.router.spool import SpoolWriter
from tests.unit.conftest import FakeMesh

KEY = "$share/g/jobs/#"


def test_a_clean_start_hands_on_the_group_copies_its_ended_session_brought_spooled(tmp_path):
    """The member's old router had 12 group copies queued (its client read nothing: its window
    was full) and 2 of a normal subscription; the new router, with a log, spooled them all. The
    CONNECT started clean: the session ends here, and the 12 went with the spool file (a loaded
    run of tests/cluster/test_shared_member_moves.py lost them so). Now each goes on to another
    member's router, for the group alone; the normal ones do not."""
    async def run() -> tuple[Router, FakeMesh]:
        old = Router(RouterConfig(router_id="n/w1"))
        s = old.new_session("m", False)
        old.subscribe_shared(s, Subscription(KEY, 1))
        old.subscribe(s, Subscription("plain/#", 1))
        header = s.export_header(True)
        mesh = FakeMesh()
        new = Router(RouterConfig(router_id="n/w0"), mesh)  # type: ignore[arg-type]
        log_ = CommitLog(tmp_path / "n" / "w0", router_id="n/w0", loop=asyncio.get_running_loop())
        new.attach_log(log_, False)
        writer = SpoolWriter(log_.directory)
        writer.add([[1, False, Message(f"jobs/{i}", b"%d" % i, qos=1).to_list()] for i in range(12)]
                   + [[1, False, Message("plain/x", b"plain", qos=1).to_list()]] * 2)
        header["spool"] = writer.finish().to_list()
        new.peer_interest("n/w2", KEY, 1)  # the group's other member is on n/w2
        session = new.import_session("m", header)
        assert [r.copies for r in session.ranges] == [True]
        new.end_session(session)  # (a clean start: ``Connecting._finish_connect``)
        log_.close()
        return new, mesh

    new, mesh = asyncio.run(run())
    assert mesh.only == [("n/w2", b"%d" % i, [KEY]) for i in range(12)]
    assert new.stats.shared_no_member == 0
