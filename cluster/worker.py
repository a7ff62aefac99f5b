"""One worker process: a uvloop event loop, one router, its client listener and its mesh socket.

Runs in a process forked by the supervisor. Every worker binds the same MQTT port with
SO_REUSEPORT, so the kernel spreads new connections over the workers without a hand-off.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from typing import TYPE_CHECKING, Any

from brokerd.connection.batching import EndOfTick, TurnBudget
from brokerd.connection.guard import ConnectionGuard
from brokerd.connection.keepalive import KeepaliveWheel
from brokerd.connection.listener import Listener
from brokerd.connection.protocol import MQTTConnection
from brokerd.router.client import Client
from brokerd.router.limits import ClientLimits
from brokerd.router.router import Router, RouterConfig
from brokerd.router.session import SessionLimits, router_log_dir

from .config import Config
from .limits import connections_per_worker, open_files
from .listeners import reload_tls, serve_listeners
from .stats import ConnectionSet, StatsPublisher

if TYPE_CHECKING:
    from .agreement.owners import SessionOwners

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
        self.keepalive = KeepaliveWheel(self.loop)  # every connection's keepalive deadline, one timer
        self.turn: TurnBudget | None = None  # made in start(): the fan budget counts the router's deliveries
        self.guard: ConnectionGuard | None = None  # made in start(): it counts in the router's stats
        self.router: Router | None = None
        self.servers: list[asyncio.base_events.Server] = []  # one per listener
        self.tls_contexts: dict[Listener, Any] = {}  # TLS listeners' SSL contexts, reloaded on SIGUSR1
        self.mesh: Any = None
        self.replication: Any = None
        self.agreement: Any = None  # cluster.agreement.client.AgreementClient, with --agreement
        self.owners: SessionOwners | None = None  # the router's agreed owners, with --agreement
        # The live connections, and what all of them carried (read by the stats publisher).
        self.connections = ConnectionSet()
        self.commit_log: Any = None
        self._log_timer: asyncio.TimerHandle | None = None
        self._stop = asyncio.Event()

    def _router_config(self) -> RouterConfig:
        c = self.config
        return RouterConfig(
            router_id=self.router_id,
            node_id=c.node_id,
            max_connections=connections_per_worker(c.max_connections, c.workers, open_files()),
            workers=c.workers,
            max_packet_size=c.max_packet_size,
            session=SessionLimits(max_inflight=c.max_inflight, max_queued=c.max_queued),
            limits=ClientLimits.from_config(c),
            topic_alias_out=c.topic_alias_out,
            moved_in_keep_s=c.mesh_forget,
            session_owner=c.session_owner,
            verifies_identities=bool(c.password_file or c.auth_plugin
                                     or any(x.use_identity_as_username for x in c.listeners)),
            agreed=c.agreement is not None and (c.workers > 1 or c.mesh is not None),
        )

    def _open(self, conn: MQTTConnection) -> Client:
        self.connections.add(conn)
        router = self.router
        assert router is not None  # made in start(), before the listeners: no connection comes without it
        return Client(router, conn)

    def _protocol(self, listener: Listener | None = None) -> MQTTConnection:
        return MQTTConnection(self._open, self.batcher, max_packet_size=self.config.max_packet_size,
                              write_buffer_high=self.config.max_client_buffer,
                              read_budget=self.config.read_budget, turn=self.turn,
                              max_topic_levels=self.config.max_topic_levels, listener=listener,
                              guard=self.guard, keepalive=self.keepalive,
                              traffic=self.connections.traffic, loop=self.loop)

    async def start(self) -> None:
        c = self.config
        self.router = Router(self._router_config())
        self.router.live_connections = self.connections  # a client leaving takes its connection out
        from .auth_setup import install as install_auth
        from .auth_setup import reload as reload_auth

        install_auth(self.router, c)  # before any session exists (sessions hold the ACL)
        if c.turn_budget or c.fan_budget:
            traffic = self.connections.traffic
            self.turn = TurnBudget(self.loop, c.turn_budget, c.fan_budget, lambda: traffic.msgs_out)
        # Connection-layer limits: the listener's rate is shared by the workers (the kernel spreads
        # connections over them), a client's rates and the unfinished-packet timeout are per client.
        self.guard = ConnectionGuard(
            self.loop, connection_rate=c.max_connection_rate / c.workers if c.max_connection_rate else 0.0,
            msg_rate=c.max_client_msg_rate, byte_rate=c.max_client_byte_rate, packet_timeout=c.packet_timeout,
            stats=self.router.stats, sockets=self.router.listener_sockets)
        if c.log:
            self._open_log()
        if c.workers > 1 or c.mesh is not None:
            from .mesh import Mesh

            # One end-of-iteration flush: connections, log, mesh.
            self.mesh = Mesh(self.config, self.index, self.router, self.loop, self.batcher)
            self.router.attach_mesh(self.mesh)
            await self.mesh.start()
            if self.commit_log is not None:
                # The other local routers have opened (recovered) their logs: they answered the mesh.
                from brokerd.router.persistence import restore_missing_copies

                restore_missing_copies(self.router, os.path.join(c.data_dir, c.node_id), self.name)
            if self.commit_log is not None and c.mesh is not None:
                # Follower of other nodes' logs placed here; leader of its own with R > 1.
                from .replication import Replication

                self.replication = Replication(c, self.router, self.mesh, self.loop)
                self.mesh.replication = self.replication
        if self.replication is not None:
            await self.replication.ready()  # an empty log continues beyond what other nodes hold
        if c.agreement is not None and self.mesh is not None:
            await self._join_agreement()
        self.servers = await serve_listeners(self.loop, c, self._protocol, self.tls_contexts)
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self._stop.set)
        self.loop.add_signal_handler(signal.SIGUSR1, self._reload, reload_auth)  # the supervisor's SIGHUP
        self._start_stats()

    async def _join_agreement(self) -> None:
        """Persistent sessions are served by the owner the agreement names (``--agreement``): the
        node's member is reached through its agreement service; the sessions restored from this
        router's snapshot are checked against the records in the background."""
        from .agreement.client import AgreementClient
        from .agreement.owners import SessionOwners
        from .agreement.state import INSYNC

        router = self.router
        assert router is not None
        self.agreement = AgreementClient(self.config, self.loop)
        await self.agreement.start()
        owners = SessionOwners(self.router_id, self.agreement, self.config.agreement_timeout)
        owners.fence = router.fence_stale
        owners.holds = lambda cid: cid in router.sessions or cid in router.clients
        self.agreement.on_owned = owners.on_owned
        router.owners = self.owners = owners
        replication = self.replication
        if replication is not None:
            replication.agreed = owners

            def on_owned(batch: list) -> None:  # sessions' records to the owners, in-sync sets to replication
                owners.on_owned(batch)
                for kind, key, followers, epoch in batch:
                    if kind == INSYNC:
                        replication.insync_published(key, epoch, followers)

            self.agreement.on_owned = on_owned
            self.agreement.on_majority = replication.agreement_majority
        restored = [cid for cid, s in router.sessions.items() if s.persistent or s.expiry_s]
        owners.check_restored(restored, lambda cid: cid in router.clients)

    def _reload(self, reload_auth: Any) -> None:
        """SIGUSR1 (the supervisor's SIGHUP): the password and ACL files (an auth plugin's kept
        answers forgotten), and the TLS certificates."""
        from .auth_setup import reloads

        if reloads(self.config):
            reload_auth(self.router, self.config)
        reload_tls(self.tls_contexts)

    # -- commit log -----------------------------------------------------------------------------------

    def _open_log(self) -> None:
        from brokerd.router.log import CommitLog
        from brokerd.router.persistence import StateStore
        from brokerd.router.spool import collect as collect_spools

        c = self.config
        router = self.router
        assert router is not None
        directory = router_log_dir(c.data_dir, self.router_id)
        os.makedirs(directory, mode=0o700, exist_ok=True)  # segments and state.msgpack: 0600 inside
        self.commit_log = CommitLog(
            directory, router_id=self.router_id, loop=self.loop, fsync=c.fsync,
            fsync_interval_ms=c.fsync_interval_ms, segment_bytes=c.segment_bytes,
            retention_bytes=c.retention_bytes or None, retention_hours=c.retention_hours or None)
        router.attach_log(self.commit_log, c.fsync == "always", self.batcher)
        state = StateStore(router, directory)
        router.attach_state(state)
        # In a cluster a restored delayed will waits at least as long as a CONNECT right after a
        # death does: time for a replica's notice that it published the will already.
        will_grace = 0.0
        if c.peer or c.mesh:
            from .mesh import park_skew

            will_grace = park_skew(c)
        sessions, retained = state.load(will_grace=will_grace)
        state.write_now()
        # Spool files of this router no restored session names: a transfer a crash cut short.
        named = [r.directory for s in router.sessions.values() for r in s.ranges if r.copies]
        if gone := collect_spools(directory, named):
            log.info("spool: %d file(s) of transfers that did not finish removed", gone)
        log.info("commit log %s: offsets %d..%d, %d persistent sessions, %d retained messages restored",
                 directory, self.commit_log.start_offset, self.commit_log.next_offset - 1, sessions, retained)
        self.commit_log.on_error(self._log_error)
        self._log_timer = self.loop.call_later(1.0, self._log_tick, 0)

    def _log_error(self, error: OSError | None) -> None:
        if error is None:
            log.warning("commit log writable again: QoS 1/2 publishes accepted")
        else:
            log.error("commit log unavailable (%s): QoS 1/2 publishes are refused until it recovers", error)

    def _log_tick(self, n: int) -> None:
        """Once a second: snapshot positions, retry a failed log; once a minute: retention."""
        router = self.router
        assert router is not None and router.state is not None  # (``_open_log`` attached it)
        commit_log = self.commit_log
        router.state.periodic()
        if commit_log.error is not None:
            commit_log.try_recover()
        if n % 60 == 59:
            deleted = commit_log.enforce_retention()
            if deleted:
                log.info("retention deleted %d segment(s) of %s", len(deleted), commit_log.directory)
        self._log_timer = self.loop.call_later(1.0, self._log_tick, n + 1)

    async def _close_log(self) -> None:
        if self.commit_log is None:
            return
        assert self._log_timer is not None and self.router is not None and self.router.state is not None
        self._log_timer.cancel()
        # The log first: the snapshot's positions name at most its written end (``StateStore``),
        # which after the close is its end, so a restart re-reads nothing.
        await self.commit_log.aclose()
        try:
            self.router.state.write_now()
        except OSError as exc:
            log.error("cannot write the session snapshot: %s", exc)

    # -- stats (cluster/stats.py owns what happens here) -------------------------------------------

    def _start_stats(self) -> None:
        """Start this router's stats publisher (PUB socket, snapshots, $SYS topics)."""
        # (called at the end of start(), which made the router)
        # (mypy: start() made the router before this (mypy sees ``Router | None``))
        self.stats_publisher: StatsPublisher | None = StatsPublisher(
            self.config, self.index, self.router, self.connections, self.loop)  # type: ignore[arg-type]
        self.stats_publisher.replication = self.replication
        self.stats_publisher.start()

    def _stop_stats(self) -> None:
        """Stop the stats publisher (close its socket)."""
        publisher = getattr(self, "stats_publisher", None)
        if publisher is not None:
            self.stats_publisher = None
            publisher.stop()

    async def run(self, ready_fd: int | None) -> None:
        await self.start()
        tune_gc()
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
        for server in self.servers:
            server.close()
        for conn in list(self.connections):
            conn.close(0x8B)  # MQTT 5: server shutting down
        self.keepalive.close()
        self._stop_stats()
        if self.mesh is not None:
            await self.mesh.stop()
        await asyncio.sleep(0)  # let the transports flush their closing writes
        if self.replication is not None:
            await self.replication.close()
        if self.agreement is not None:
            assert self.owners is not None  # (set with ``agreement``)
            self.owners.close()
            await self.agreement.close()
        await self._close_log()
        log.info("router %s stopped", self.router_id)


def tune_gc() -> None:
    """Keep the cyclic garbage collector out of the hot path's tail latency.

    A router allocates a few short-lived objects per message (decoded packets, Message, lists), and
    CPython's default gen-0 threshold (700 allocations) runs a collection every couple of hundred
    messages; every tenth of those walks gen 1, and gen 2 walks everything the router holds. Under
    load that is ~10 % of the CPU and multi-millisecond pauses (p99 of the latency side channel at
    saturation: 10 ms with the defaults, 5.8 ms with this). The objects made at start (modules,
    config, restored state) are frozen out of the collector's sight; collections run 70x less often.
    Reference counting still frees everything acyclic at once, so memory does not grow.
    """
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def worker_main(config: Config, index: int, ready_fd: int | None) -> int:
    """Entry point in the forked child."""
    for handler in logging.getLogger().handlers:  # name the router in every log line
        fmt = (handler.formatter._fmt if handler.formatter else None) or "%(message)s"
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
