"""A CONNECT's takeover with its result handed to a callback (cluster/mesh/takeover.py
``takeover_then``): where the first answers settle it, no task waits for them and the callback
gets what ``takeover`` would have returned; where there is more to do (an offer to settle), the
rest runs as ``takeover``'s own waits and the callback gets their result. The parts as the
``Mesh`` wires them (tests.unit.test_mesh_takeovers), fake router, peers and links; no sockets."""

from __future__ import annotations

import asyncio

from brokerd.router.mesh_format import TAKEOVER_REQ
from tests.unit.test_mesh_takeovers import OLD, parts


def test_a_client_id_nobody_holds_is_settled_from_the_answers_callback_with_no_task():
    async def main() -> tuple[list, set[str], int]:
        loop = asyncio.get_running_loop()
        takeovers, _handons, transfers, _router, old, sent = parts(loop)
        results: list = []
        answered: set[str] = set()
        takeovers.takeover_then("c", ["u", False], answered, results.append)
        await asyncio.sleep(0)  # the turn's end: the ask goes
        [(kind, [req, client_id, *_])] = sent
        assert (kind, client_id) == (TAKEOVER_REQ, "c")
        waiting = asyncio.all_tasks() - {asyncio.current_task()}
        transfers.on_takeover_resp(old, [req, None, False], 0)  # nobody has it
        await asyncio.sleep(0)  # the answers' callback
        return results, answered, len(waiting)

    results, answered, tasks = asyncio.run(main())
    assert tasks == 0, "a task waited for the answers"
    assert results == [None] and answered == {OLD}


def test_an_offered_session_is_settled_by_takeovers_own_waits_and_handed_to_the_callback():
    async def main() -> list:
        loop = asyncio.get_running_loop()
        takeovers, _handons, transfers, _router, old, sent = parts(loop)
        results: list = []
        takeovers.takeover_then("c", None, set(), results.append)
        await asyncio.sleep(0)
        [(_kind, [req, *_])] = sent
        transfers.on_takeover_resp(old, [req, {"client_id": "c", "queue": []}, False], 0)
        for _ in range(5):  # the callback, the task's turns, its done callback
            await asyncio.sleep(0)
        return results

    [state] = asyncio.run(main())
    assert state is not None and state["offered_by"] == OLD, state


def test_a_closed_mesh_hands_the_callback_nothing_to_take():
    async def main() -> list:
        takeovers, *_rest, sent = parts(asyncio.get_running_loop())
        takeovers.closed = True
        results: list = []
        takeovers.takeover_then("c", None, set(), results.append)
        for _ in range(3):
            await asyncio.sleep(0)
        assert sent == [], "a closed mesh asked"
        return results

    assert asyncio.run(main()) == [None]
