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
    """The budgets of every connection with the same read budget in one worker: one object they
    share (``shared_flow``). What each connection measures of its own traffic (its fan, its
    packets) it keeps itself and passes in: a FlowControl of its own cost 64 bytes a connection
    for two references every connection of its worker holds alike."""

    __slots__ = ("cap", "turn")

    def __init__(self, read_budget: int, turn: TurnBudget | None) -> None:
        self.cap = max(1, read_budget)
        self.turn = turn  # the worker's budget for all connections in one turn, if any

    def limit(self, fan: float) -> int | None:
        """Packets a connection may decode now (None: the decoder's own limit, no turn budget).
        ``fan``: its deliveries per packet of its last turn (``fanned``; 0.0: none measured)."""
        turn = self.turn
        if turn is None:
            return None
        limit = turn.share(self.cap)
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
        """Whether the deliveries of a connection's packets are to be counted (a fan budget)."""
        return self.turn is not None and bool(self.turn.fan_budget)

    def delivered(self) -> int:
        # (mypy: called only where ``counts`` found a turn budget)
        return self.turn.delivered()  # type: ignore[union-attr, misc]

    def fanned(self, before: int, n: int, mean_size: int) -> float:
        """The fan of a connection whose ``n`` packets caused ``delivered() - before``
        deliveries: a delivery counts once more per FAN_BYTES of its mean packet size (measured:
        1 KiB fan-outs need half the deliveries per turn for the same tail)."""
        return (self.delivered() - before) * (1 + mean_size // FAN_BYTES) / n


_shared: dict[tuple[int, int], FlowControl] = {}
KEPT = 64  # budgets remembered at most (a worker has one or two; tests make many)


def shared_flow(read_budget: int, turn: TurnBudget | None) -> FlowControl:
    """The FlowControl of this read budget and turn budget, made once."""
    key = (read_budget, id(turn))
    flow = _shared.get(key)
    if flow is not None and flow.turn is turn:
        return flow
    if len(_shared) >= KEPT:
        _shared.clear()
    flow = _shared[key] = FlowControl(read_budget, turn)
    return flow
