"""How much of one connection's input is handled per loop iteration: uvicorn's ``FlowControl``
model, a small class beside the protocol so the protocol stays a thin driver.

Three budgets bound a turn (see docs/tuning.md and ``connection.batching.TurnBudget``):
the read budget (packets of this connection per iteration), the worker's turn budget (packets of
all connections together) and the fan budget (deliveries this connection's packets may cause,
measured on its last turn). What is beyond them stays undecoded, with reading paused, for the next
iteration. The reasons to pause reading (a budget, a client's output buffer above its limit, a
backed-up mesh peer, a CONNECT waiting for the cluster) are kept as a set of causes: reading resumes
when none is left.
"""

from __future__ import annotations

from .batching import TurnBudget

FAN_BYTES = 1024  # with a fan budget: a delivery counts once more per this many bytes of packet
BUDGET = object()  # the pause cause while a read's remaining packets wait for the next turn
OUTPUT = "output"  # the pause cause while the client's output buffer is above --max-client-buffer


class FlowControl:
    __slots__ = ("cap", "turn", "fan", "packets")

    def __init__(self, read_budget: int, turn: TurnBudget | None) -> None:
        self.cap = max(1, read_budget)
        self.turn = turn  # the worker's budget for all connections in one turn, if any
        self.fan = 0.0  # deliveries per packet of the last turn's packets, a large one counting more
        self.packets = 0  # packets decoded (with a fan budget)

    def limit(self) -> int | None:
        """Packets this connection may decode now (None: the decoder's own limit, no turn budget)."""
        turn = self.turn
        if turn is None:
            return None
        limit = turn.share(self.cap)
        fan = self.fan
        if fan:  # its packets were delivered last turn: at most fan_budget deliveries this one
            per = int(turn.fan_budget / fan)
            if per < limit:
                limit = per if per > 1 else 1
        return limit

    def took(self, n: int) -> None:
        """``n`` packets were decoded this turn."""
        if self.turn is not None:
            self.turn.left -= n

    @property
    def measures_fan(self) -> bool:
        """Whether the deliveries of this connection's packets are to be counted (a fan budget)."""
        return self.turn is not None and bool(self.turn.fan_budget)

    def delivered(self) -> int:
        # (mypy: called only where ``counts`` found a turn budget)
        return self.turn.delivered()  # type: ignore[union-attr, misc]

    def fanned(self, before: int, n: int, mean_size: int) -> None:
        """``n`` packets caused ``delivered() - before`` deliveries; a delivery counts once more per
        FAN_BYTES of the connection's mean packet size (measured: 1 KiB fan-outs need half the
        deliveries per turn for the same tail)."""
        self.fan = (self.delivered() - before) * (1 + mean_size // FAN_BYTES) / n
