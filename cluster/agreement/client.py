"""A worker's client of its node's agreement service (cluster/agreement/service.py).

It lives on the worker's event loop and never blocks it: a DEALER for requests and a SUB for what
the service publishes, plain ZeroMQ sockets whose descriptors the loop watches (as cluster/mesh/transport.py
does; ZeroMQ's descriptor is edge-triggered, so every read drains, and a send is followed by a
read). It imports no Raft engine: PySyncObj runs in the service alone.

The service may not be up yet, or restarting: a request then waits for it, bounded by its
timeout, and raises ``NoAgreement``, as one that no majority committed in time does (a proposal
carries its deadline: one that reaches the service later is not proposed). Its outcome is then
unknown (an entry may still commit), which the conditional commands make harmless: the caller
reads the record again and moves from whatever holds.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import msgpack
import zmq

from ..config import Config
from ..paths import agreement_ipc, agreement_pub
from .service import QUEUE_HWM
from .state import NoAgreement

__all__ = ["AgreementClient", "NoAgreement"]

log = logging.getLogger(__name__)

SILENT_S = 2.5  # no ["majority", ...] for this long (it comes every second): the service is gone
CHECK_S = 1.0


class AgreementClient:
    """Proposals, reads and status through the node's service; ``majority`` and moves as published.

    ``on_owned``: called on the loop with each batch of changed records (``[kind, key, owner,
    epoch]``; owner None once released). ``on_majority``: called on the loop when ``majority``
    changes (False until the service is heard; False again when it falls silent).

    ``clock``: monotonic seconds, for the service's silence (``SILENT_S``) and a proposal's
    deadline, so a test drives the silence rule with a ``FakeClock``'s ``now``. The host's
    monotonic clock in a broker: the deadline travels to the service, another process of the
    same host, which compares it with its own."""

    def __init__(self, config: Config, loop: asyncio.AbstractEventLoop,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.loop = loop
        self._clock = clock
        self.majority = False
        self.on_owned: Callable[[list[list]], None] | None = None
        self.on_majority: Callable[[bool], None] | None = None
        self._ids = itertools.count(1)
        self._waiters: dict[int, asyncio.Future] = {}
        self._heard = 0.0  # when the service last said whether it has a majority
        self._ctx: zmq.Context | None = None
        self._dealer: zmq.Socket | None = None
        self._sub: zmq.Socket | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._packer = msgpack.Packer(use_bin_type=True)

    async def start(self) -> None:
        self._ctx = zmq.Context(1)
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.SNDHWM, QUEUE_HWM)  # every CONNECT of a mass failover asks at once
        dealer.setsockopt(zmq.RCVHWM, QUEUE_HWM)
        dealer.connect(agreement_ipc(self.config))  # ipc reconnects by itself: the service may come later
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, QUEUE_HWM)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(agreement_pub(self.config))
        self._dealer, self._sub = dealer, sub
        self.loop.add_reader(dealer.FD, self._on_answers)
        self.loop.add_reader(sub.FD, self._on_published)
        self._timer = self.loop.call_later(CHECK_S, self._check)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for sock in (self._dealer, self._sub):
            if sock is not None:
                try:
                    self.loop.remove_reader(sock.FD)
                except (ValueError, zmq.ZMQError):
                    pass
                sock.close(0)
        self._dealer = self._sub = None
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(NoAgreement("the agreement client closed"))
        self._waiters.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def propose(self, commands: list, timeout: float | None = None) -> list:
        """One batch of commands (state.py's), committed as a whole entry or not: their results.
        Raises ``NoAgreement`` when no majority committed it within ``timeout``."""
        timeout = self.config.agreement_timeout if timeout is None else timeout
        answer = await self._ask(["propose", list(commands), timeout, self._clock() + timeout], timeout)
        results: list = answer[0]
        return results

    async def read(self, kind: str, key: str, timeout: float = 1.0) -> tuple[str | None, int]:
        """The service's local view of ``key``'s record (maybe stale: a move is agreed by ``propose``)."""
        owner, epoch = await self._ask(["read", kind, key], timeout)
        return owner, epoch

    async def status(self, timeout: float = 1.0) -> dict:
        status: dict = (await self._ask(["status"], timeout))[0]
        return status

    async def _ask(self, request: list, timeout: float) -> list:
        if self._dealer is None:
            raise NoAgreement("the agreement client is not started")
        req = next(self._ids)
        waiter = self.loop.create_future()
        self._waiters[req] = waiter
        try:
            try:
                self._dealer.send(self._packer.pack([req, *request]), zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                raise NoAgreement(f"the agreement service cannot be reached: {exc}") from None
            self.loop.call_soon(self._on_answers)  # a send can swallow the descriptor's edge
            try:
                return await asyncio.wait_for(waiter, timeout)
            except TimeoutError:
                raise NoAgreement(f"no answer from the agreement service within {timeout:g}s") from None
        finally:
            self._waiters.pop(req, None)

    def _on_answers(self) -> None:
        for msg in _drain(self._dealer):
            try:
                req, verdict, *rest = msg
            except (TypeError, ValueError):
                continue
            waiter = self._waiters.get(req) if isinstance(req, int) else None
            if waiter is None or waiter.done():
                continue  # answered after its caller gave up (or a previous client's)
            if verdict == "ok":
                waiter.set_result(rest)
            else:
                waiter.set_exception(NoAgreement(str(rest[0]) if rest else "refused"))

    def _on_published(self) -> None:
        for msg in _drain(self._sub):
            if not isinstance(msg, list) or len(msg) != 2:
                continue
            what, body = msg
            if what == "majority":
                self._heard = self._clock()
                self._set_majority(bool(body))
            elif what == "owned" and self.on_owned is not None:
                try:
                    self.on_owned(body)
                except Exception:  # noqa: BLE001 - the next batches must still arrive
                    log.exception("agreement: a batch of moves could not be handled")

    def _set_majority(self, value: bool) -> None:
        if value != self.majority:
            self.majority = value
            if self.on_majority is not None:
                self.on_majority(value)

    def _check(self) -> None:
        """Once a second: read what a lost edge may have left, and drop a majority nobody repeats."""
        self._timer = self.loop.call_later(CHECK_S, self._check)
        self._on_answers()
        self._on_published()
        if self.majority and self._clock() - self._heard > SILENT_S:
            self._set_majority(False)


def _drain(sock: zmq.Socket | None) -> list[Any]:
    """Every message waiting on ``sock``, decoded (an undecodable one is left out)."""
    out: list[Any] = []
    if sock is None:
        return out
    while True:
        try:
            data = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return out
        except zmq.ZMQError:
            return out
        try:
            out.append(msgpack.unpackb(data, raw=False, strict_map_key=False))
        except (ValueError, TypeError, msgpack.UnpackException):
            continue
