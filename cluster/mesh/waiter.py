"""A request every live peer answers: an interest announcement's acknowledgements, a takeover's
answers. Its future completes when the last peer answers, falls silent, or the request expires."""

from __future__ import annotations

import asyncio


class Waiter:
    """A request answered by every live peer (interest acks, takeover answers)."""

    __slots__ = ("future", "waiting", "result", "missed", "offers", "ends")

    def __init__(self, loop: asyncio.AbstractEventLoop, peers: set[str]) -> None:
        # Completes with a takeover's result (``MeshPort.takeover``), or an interest's ends.
        self.future: asyncio.Future[dict | None] = loop.create_future()
        self.waiting = peers
        self.result: dict | None = None
        self.missed: set[str] = set()  # peers that fell silent or timed out instead of answering
        self.offers: list[tuple[str | None, int, dict]] = []  # takeover: (router, request, session) offered
        # Interest: each acknowledging router's log end when it took the announcement in. The
        # future of an interest waiter completes with this dict (``Router.hand_on``'s marks).
        self.ends: dict[str, int] | None = None

    def answer(self, router_id: str, result: dict | None = None) -> None:
        self.waiting.discard(router_id)
        if result is not None and self.result is None:
            self.result = result
        if not self.waiting:
            self.finish()

    def finish(self) -> None:
        if not self.future.done():
            self.future.set_result(self.ends if self.ends is not None else self.result)
