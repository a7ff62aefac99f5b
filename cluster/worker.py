"""One worker process: a uvloop event loop, one router, its client listener and its mesh socket.

Runs in a process forked by the supervisor. Every worker binds the same MQTT port with
SO_REUSEPORT, so the kernel spreads new connections over the workers without a hand-off.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
from typing import Any

from connection.batching import EndOfTick
from connection.protocol import MQTTConnection
from router.client import Client
from router.router import Router, RouterConfig
from router.session import SessionLimits

from .config import Config

log = logging.getLogger(__name__)


def router_name(index: int) -> str:
    return f"w{index}"


class Worker:
    def __init__(self, config: Config, index: int) -> None:
        self.config = config
        self.index = index
        self.name = router_name(index)
        self.router_id = f"{config.node_id}/{self.name}"
        self.loop = asyncio.get_event_loop()
        self.batcher = EndOfTick(self.loop)
        self.router: Router | None = None
        self.server: asyncio.base_events.Server | None = None
        self.mesh: Any = None
        self.connections: set[MQTTConnection] = set()
        self._stop = asyncio.Event()

    def _router_config(self) -> RouterConfig:
        c = self.config
        return RouterConfig(
            router_id=self.router_id,
            node_id=c.node_id,
            max_connections=math.ceil(c.max_connections / c.workers),
            max_packet_size=c.max_packet_size,
            session=SessionLimits(max_inflight=c.max_inflight, max_queued=c.max_queued),
        )

    def _open(self, conn: MQTTConnection) -> Client:
        self.connections.add(conn)
        return _TrackedClient(self.router, conn, self.connections)  # type: ignore[arg-type]

    def _protocol(self) -> MQTTConnection:
        return MQTTConnection(self._open, self.batcher, max_packet_size=self.config.max_packet_size,
                              write_buffer_high=self.config.max_client_buffer)

    async def start(self) -> None:
        c = self.config
        self.router = Router(self._router_config())
        if c.workers > 1 or c.mesh is not None:
            from .mesh import Mesh

            self.mesh = Mesh(self.config, self.index, self.router, self.loop)
            self.router.mesh = self.mesh
            await self.mesh.start()
        host, port = c.listen
        self.server = await self.loop.create_server(self._protocol, host, port, reuse_port=True, backlog=4096)
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self._stop.set)
        self._start_stats()

    # -- stats (cluster/stats.py owns what happens here) -------------------------------------------

    def _start_stats(self) -> None:
        """Start this router's stats publisher (PUB socket, snapshots, $SYS topics)."""
        from .stats import ConnectionSet, StatsPublisher

        # A connection set that banks the counters of each connection leaving it, so that router
        # totals outlive connections at no per-message cost; connections accepted before this call
        # are moved over (their handlers leave the set they were given).
        tracked = ConnectionSet(self.connections)
        for conn in self.connections:
            if isinstance(conn.handler, _TrackedClient):
                conn.handler._registry = tracked
        self.connections = tracked
        self.stats_publisher: StatsPublisher | None = StatsPublisher(
            self.config, self.index, self.router, tracked, self.loop)  # type: ignore[arg-type]
        self.stats_publisher.start()

    def _stop_stats(self) -> None:
        """Stop the stats publisher (close its socket)."""
        publisher = getattr(self, "stats_publisher", None)
        if publisher is not None:
            self.stats_publisher = None
            publisher.stop()

    async def run(self, ready_fd: int | None) -> None:
        await self.start()
        if ready_fd is not None:
            try:
                os.write(ready_fd, b"1")
            except OSError:
                pass  # a restarted worker: nobody waits for its readiness
            os.close(ready_fd)
        await self._stop.wait()
        await self.stop()

    async def stop(self) -> None:
        """Graceful stop: stop accepting, close clients after flushing, leave the mesh."""
        if self.server is not None:
            self.server.close()
        for conn in list(self.connections):
            conn.close(0x8B)  # MQTT 5: server shutting down
        self._stop_stats()
        if self.mesh is not None:
            await self.mesh.stop()
        await asyncio.sleep(0)  # let the transports flush their closing writes
        log.info("router %s stopped", self.router_id)


class _TrackedClient(Client):
    """A Client that also leaves the worker's connection set when it goes."""

    __slots__ = ("_registry",)

    def __init__(self, router: Router, conn: MQTTConnection, registry: set[MQTTConnection]) -> None:
        super().__init__(router, conn)
        self._registry = registry

    def connection_lost(self, graceful: bool) -> None:
        self._registry.discard(self.conn)
        super().connection_lost(graceful)


def worker_main(config: Config, index: int, ready_fd: int | None) -> int:
    """Entry point in the forked child."""
    for handler in logging.getLogger().handlers:  # name the router in every log line
        fmt = handler.formatter._fmt if handler.formatter else "%(message)s"  # type: ignore[union-attr]
        handler.setFormatter(logging.Formatter(fmt.replace(f"[{config.node_id}]",
                                                           f"[{config.node_id}/{router_name(index)}]")))
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    worker = Worker(config, index)
    try:
        loop.run_until_complete(worker.run(ready_fd))
    except OSError as exc:
        log.error("worker %d: %s", index, exc)
        return 1
    finally:
        loop.close()
    return 0
