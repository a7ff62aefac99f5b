"""The per-iteration turn budget that all of a worker's connections share."""

from __future__ import annotations

import asyncio

from connection.batching import TurnBudget


def test_shares_shrink_within_a_turn_and_start_over_in_the_next():
    async def run() -> list[list[int]]:
        turn = TurnBudget(asyncio.get_running_loop(), 40)
        turns = []
        for _ in range(2):
            shares = []
            for _ in range(5):  # five busy connections, each wanting 16
                n = turn.share(16)
                turn.left -= n
                shares.append(n)
            turns.append(shares)
            await asyncio.sleep(0)  # the next loop iteration
        return turns

    first, second = asyncio.run(run())
    assert first == [16, 16, 8, 4, 4]  # 40 in all, then the minimum so that nobody starves
    assert second == first  # the count started over


def test_a_quiet_turn_gives_every_connection_its_cap():
    async def run() -> list[int]:
        turn = TurnBudget(asyncio.get_running_loop(), 64)
        return [turn.share(16) for _ in range(3)]  # nothing taken yet: each may take its cap

    assert asyncio.run(run()) == [16, 16, 16]
