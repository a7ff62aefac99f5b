"""The mesh's transport: ZeroMQ sockets, CURVE, socket monitors and backpressure.

Every router binds one PULL socket (ipc:// for the routers of its node, and tcp:// with
``--mesh``, CURVE with ``--mesh-key``) and holds one PUSH socket per peer endpoint (a ``Link``).
A link at its high-water mark keeps frames in a list and pauses the client connections behind
them until it drains (``_drain``, every 5 ms while any link is blocked). This is the part that
owns sockets; the rest of the mesh hands it bytes.
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING

import zmq

from brokerd.router.mesh_format import max_frame

from ..config import WILDCARDS
from ..paths import ensure_run_dir, mesh_ipc
from .limits import CURVE_PERSIST_S, CURVE_STREAK_GAP_S, MAX_PENDING_FRAMES, log

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Iterable

    from zmq.auth.asyncio import AsyncioAuthenticator

    from brokerd.router.ports import Source
    from brokerd.router.router import Router

    from ..config import Config


# A link that lost its connection tries again this often at most: a peer back from a cut is
# reached within this (and a connect attempt's bound, ``tcp_link_options``).
RECONNECT_IVL_MAX_MS = 500


def tcp_link_options(mesh_timeout: float) -> dict[int, int]:
    """A tcp link's ZeroMQ options that bound how long it stays broken after a cut heals.

    Without them a link whose packets were dropped waits for TCP's retransmissions, whose
    interval doubles at each loss: the wait after a heal grows with the cut (measured on veth
    links: 0.2 to 1 s after a 3 to 5 s cut, 7 s after a 10 s one, 10 s after 20 s; partition
    seed 315, 17 to 23 s), and a connection whose peer is gone is never replaced. So the link
    pings its peer (ZMTP heartbeats) every third of ``--mesh-timeout`` and replaces a connection
    that answered nothing for a whole mesh timeout (the peer counts as gone by then anyway; the
    frames lost with the connection are sent again, ``delivery``, and a session that moves off
    the receiver meanwhile has them read back, ``marks.named_unheard``: partition seeds 326, 331,
    332, 335 and 341 lost them before, where TCP delivers them late but in order); a connect
    attempt whose SYN went unanswered is given up after the same third, not TCP's growing SYN
    retries (1, 2, 4 s ...). The peer drops its end of a connection that sent nothing (not even a ping) for two mesh
    timeouts (``HEARTBEAT_TTL``): a replaced connection does not linger there. Measured on the
    same links with these options (a 3 s mesh timeout): back 0.02 to 0.9 s after a 4, 10 or
    20 s cut (tests/partition/test_links.py: 0.4 s after a 10 s isolation, against 3.7 s)."""
    ivl_ms = max(100, int(mesh_timeout * 1000 / 3))
    timeout_ms = max(300, int(mesh_timeout * 1000))
    return {
        zmq.HEARTBEAT_IVL: ivl_ms,
        zmq.HEARTBEAT_TIMEOUT: timeout_ms,
        zmq.HEARTBEAT_TTL: min(2 * timeout_ms, 6_553_500),  # (ZMTP carries it in deciseconds, 16 bits)
        zmq.CONNECT_TIMEOUT: ivl_ms,
    }


class Link:
    """One PUSH socket to one endpoint, with the frames waiting for it to drain."""

    __slots__ = ("endpoint", "sock", "pending", "paused", "transport")

    def __init__(self, transport: Transport, endpoint: str) -> None:
        self.transport = transport
        self.endpoint = endpoint
        self.pending: list[bytes] = []
        self.paused: set[Source] = set()  # client connections not read until this link drains
        self.sock = transport._push(endpoint)

    def send(self, frame: bytes, sources: Iterable[Source] = ()) -> bool:
        """Send or keep ``frame``; False if the link is blocked (frame kept, ``sources`` paused).

        A frame with no client connection behind it (a will, a control frame) is dropped and
        counted once this many frames are waiting: nothing can be paused to bound it otherwise.
        """
        if not self.pending:
            try:
                self.sock.send(frame, zmq.NOBLOCK)
                return True
            except zmq.Again:
                self.transport.blocked(self)
        if not sources and len(self.pending) >= MAX_PENDING_FRAMES:
            self.transport.router.stats.drop_mesh_backpressure += 1
            return False
        self.pending.append(frame)
        for src in sources:
            if src not in self.paused:
                self.paused.add(src)
                src.pause_reading(self)
        return False

    def drain(self) -> bool:
        """Push waiting frames; True when none are left (paused connections resume)."""
        pending = self.pending
        sent = 0
        try:
            for frame in pending:
                self.sock.send(frame, zmq.NOBLOCK)
                sent += 1
        except zmq.Again:
            pass
        if sent:
            del pending[:sent]
        if pending:
            return False
        self.resume()
        return True

    def resume(self) -> None:
        for conn in self.paused:
            conn.resume_reading(self)
        self.paused.clear()

    def park(self) -> list[bytes]:
        """The peer fell silent: hand back the frames waiting here (they join its backlog) and
        let the paused connections go on; the socket and what ZeroMQ queued in it stay, for the
        peer's return."""
        pending, self.pending = self.pending, []
        self.resume()
        return pending

    def reset(self) -> None:
        """Drop queued frames (the peer is gone): a new socket with nothing queued."""
        self.pending.clear()
        self.resume()
        self.sock.close(linger=0)
        self.sock = self.transport._push(self.endpoint)

    def close(self) -> None:
        self.resume()
        self.sock.close(linger=0)


class Transport:
    """A router's mesh sockets: bound by ``bind``, a ``Link`` per endpoint (``link``), blocked
    links drained, CURVE handshakes monitored, all closed by ``close``. ``on_readable(sock)`` is
    called when a PULL socket has frames."""

    def __init__(self, config: Config, index: int, loop: asyncio.AbstractEventLoop, router: Router,
                 on_readable: Callable[[zmq.Socket], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock  # the mesh's monotonic clock: how long a peer's handshakes have failed
        self.index = index
        self.loop = loop
        self.router = router  # (its stats count the frames dropped for backpressure)
        self.on_readable = on_readable
        self.max_frame = max_frame(config.max_packet_size)
        self.ctx: zmq.Context[zmq.Socket] | None = None
        self.pull: zmq.Socket | None = None
        self._tcp_pull: zmq.Socket | None = None
        self.ipc = mesh_ipc(config, index)
        self.tcp: str | None = None
        self.stats_tcp: str | None = None  # this router's stats socket, if other nodes can read it
        self.links: dict[str, Link] = {}
        self.seeds: list[Link] = []
        self._blocked_links: set[Link] = set()
        self._drain_timer: asyncio.TimerHandle | None = None
        self._auth: AsyncioAuthenticator | None = None
        self._curve: tuple[bytes, bytes] | None = None
        self.monitors: list[tuple[zmq.Socket, str, str | None]] = []
        self._refused_logged: dict[str, float] = {}
        # Per monitored socket, the run of handshake failures going on: (its first, its last).
        self._failing: dict[str, tuple[float, float]] = {}
        # Peer endpoints whose last CURVE handshake failed, and how (``brokerd stats`` names them).
        self.refused: dict[str, str] = {}

    def _push(self, endpoint: str) -> zmq.Socket:
        assert self.ctx is not None
        s = self.ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.SNDHWM, self.config.mesh_hwm)
        s.setsockopt(zmq.LINGER, 1000)
        s.setsockopt(zmq.RECONNECT_IVL, 50)
        s.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
        if endpoint.startswith("tcp://"):
            for option, value in tcp_link_options(self.config.mesh_timeout).items():
                s.setsockopt(option, value)
        if self._curve is not None and endpoint.startswith("tcp://"):
            public, secret = self._curve
            s.curve_secretkey = secret
            s.curve_publickey = public
            s.curve_serverkey = public
            self._monitor(s, f"link to {endpoint}", endpoint)
        mesh = self.config.mesh
        if endpoint.startswith("tcp://") and mesh is not None and mesh[0] not in WILDCARDS:
            # From the mesh's address: on a host with several, traffic between nodes leaves from
            # the one the operator chose for it (and firewalls see the address they expect).
            source = f"[{mesh[0]}]" if ":" in mesh[0] else mesh[0]
            s.connect(f"tcp://{source}:0;{endpoint[6:]}")
        else:
            s.connect(endpoint)
        return s

    def _monitor(self, s: zmq.Socket, what: str, peer: str | None = None) -> None:
        """Log CURVE handshake failures on both sides: the node refused says whom it cannot join
        (``peer``: the endpoint of a link), not only the node that refuses it. A link's successes
        are watched too, to tell when it joins after all."""
        events = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        if peer is not None:
            events |= zmq.EVENT_HANDSHAKE_SUCCEEDED
        self.monitors.append((s.get_monitor_socket(events), what, peer))

    def poll_monitors(self) -> None:
        """Read handshake events (from the heartbeat: rare events, no descriptor juggling) and
        log a failure at most every 30 s per socket, since ZeroMQ retries the handshake
        continuously. A link to a peer says it cannot join only once its failures go on for
        ``CURVE_PERSIST_S``: a peer that restarts, or a connection cut mid-handshake, fails a
        handshake or two and then succeeds, and "different --mesh-key files" then was false (every
        worker restart logged it at ERROR); a key that differs fails every retry. The listener side
        says each refusal (an outsider may try once), as a warning naming both causes."""
        from zmq.utils.monitor import recv_monitor_message

        now = self._clock()
        for mon, what, peer in self.monitors:
            while True:
                try:
                    ev = recv_monitor_message(mon, zmq.NOBLOCK)
                except zmq.ZMQError:
                    break
                if ev["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self._failing.pop(what, None)
                    if peer is not None and self.refused.pop(peer, None) is not None:
                        log.info("mesh: the CURVE handshake with the peer at %s succeeds now", peer)
                    continue
                if peer is not None:
                    self.refused[peer] = _event_name(ev["event"])
                first, last = self._failing.get(what, (now, now))
                if now - last > CURVE_STREAK_GAP_S:
                    first = now  # a new run of failures
                self._failing[what] = (first, now)
                if peer is not None and now - first < CURVE_PERSIST_S:
                    continue
                if now - self._refused_logged.get(what, -1e9) < 30.0:
                    continue
                self._refused_logged[what] = now
                if peer is None:
                    log.warning("mesh: %s: a CURVE handshake failed (%s) and the connection was refused: a "
                                "process without this cluster's --mesh-key, or a peer cut off mid-handshake "
                                "(restarting)", what, _event_name(ev["event"]))
                else:
                    log.error("mesh: cannot join the peer at %s: CURVE handshake failed (%s): it and this node "
                              "hold different --mesh-key files (or it has none); this node is not in its mesh "
                              "until they match (retrying)", peer, _event_name(ev["event"]))

    def refused_links(self) -> dict[str, str]:
        """Peer endpoints this node cannot join (its CURVE handshake failed last): endpoint → why."""
        return dict(self.refused)

    def _setup_curve(self, path: str) -> None:
        import zmq.auth
        from zmq.auth.asyncio import AsyncioAuthenticator

        try:
            public, secret = zmq.auth.load_certificate(path)
        except (OSError, ValueError) as exc:
            raise OSError(f"--mesh-key: cannot load {path}: {exc}") from None
        if secret is None:
            raise OSError(f"--mesh-key: {path} holds no secret key (use the .key_secret file)")
        self._curve = (public, secret)
        auth = AsyncioAuthenticator(self.ctx)
        auth.start()

        class _OnlyClusterKey:
            def callback(self, domain: str, key: bytes) -> bool:
                ok = key == public
                if not ok:
                    log.error("mesh: refused a node whose CURVE key is not this cluster's --mesh-key")
                return ok

        auth.configure_curve_callback(domain="*", credentials_provider=_OnlyClusterKey())
        self._auth = auth

    def link(self, endpoint: str) -> Link:
        link = self.links.get(endpoint)
        if link is None:
            link = self.links[endpoint] = Link(self, endpoint)
        return link

    def blocked(self, link: Link) -> None:
        self._blocked_links.add(link)
        if self._drain_timer is None:
            self._drain_timer = self.loop.call_later(0.005, self._drain)

    def unblock(self, link: Link) -> None:
        """``link``'s peer is parked: its frames went to its backlog, none are left to drain."""
        self._blocked_links.discard(link)

    def _drain(self) -> None:
        self._drain_timer = None
        for link in list(self._blocked_links):
            if link.drain():
                self._blocked_links.discard(link)
        if self._blocked_links:
            self._drain_timer = self.loop.call_later(0.005, self._drain)

    def bind(self) -> None:
        """Open the context, bind the PULL socket(s) and link to the seeds: the routers of this
        node and the ``--peer`` endpoints."""
        self.ctx = zmq.Context()
        ensure_run_dir(self.config)
        if self.config.mesh_key:
            self._setup_curve(self.config.mesh_key)
        pull = self.ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.RCVHWM, self.config.mesh_hwm)
        pull.setsockopt(zmq.LINGER, 0)
        pull.setsockopt(zmq.MAXMSGSIZE, self.max_frame)
        path = self.ipc[len("ipc://"):]
        if os.path.exists(path):
            os.unlink(path)  # left by a crashed incarnation of this router
        pull.bind(self.ipc)
        if self.config.mesh is not None:
            host, port = self.config.mesh
            tcp_pull = pull
            if self._curve is not None:
                # The ipc endpoint stays plain (same host, private directory); tcp is CURVE.
                tcp_pull = self.ctx.socket(zmq.PULL)
                tcp_pull.setsockopt(zmq.RCVHWM, self.config.mesh_hwm)
                tcp_pull.setsockopt(zmq.LINGER, 0)
                tcp_pull.setsockopt(zmq.MAXMSGSIZE, self.max_frame)
                tcp_pull.curve_server = True
                tcp_pull.curve_secretkey = self._curve[1]
                tcp_pull.curve_publickey = self._curve[0]
                self._monitor(tcp_pull, f"mesh listener {host}:{port + self.index}")
                self._tcp_pull = tcp_pull
                self.loop.add_reader(tcp_pull.FD, self.on_readable, tcp_pull)
            try:
                tcp_pull.bind(f"tcp://{host}:{port + self.index}")
            except zmq.ZMQError as exc:
                raise OSError(f"--mesh: cannot bind {host}:{port + self.index}: {exc}") from None
            if self._curve is None and self.index == 0:  # --mesh-insecure on (config refuses it otherwise)
                log.warning("mesh: %s:%d is unauthenticated and unencrypted (--mesh-insecure on): any "
                            "process that reaches it can read and inject messages", host, port)
            advertised = host if host not in WILDCARDS else socket.getfqdn()
            self.tcp = f"tcp://{advertised}:{port + self.index}"
            if self.config.mesh_advertise is not None:
                ad_host, ad_port = self.config.mesh_advertise
                self.tcp = f"tcp://{ad_host}:{ad_port + self.index}"
            if self.config.stats_port:
                # Where other nodes' `brokerd stats --cluster` reads this router (a tcp stats socket,
                # at the listener's address, or the mesh's advertised one for a wildcard listener).
                stats_host = self.config.stats_host
                if stats_host in WILDCARDS:
                    stats_host = advertised
                self.stats_tcp = f"tcp://{stats_host}:{self.config.stats_port + self.index}"
        self.pull = pull
        self.loop.add_reader(pull.FD, self.on_readable, pull)
        for j in range(self.config.workers):
            if j != self.index:
                self.seeds.append(self.link(mesh_ipc(self.config, j)))
        for host, port in self.config.peer:
            endpoint = f"tcp://{host}:{port}"
            if endpoint != self.tcp:
                self.seeds.append(self.link(endpoint))

    def close(self) -> None:
        """Close every socket, the frames still queued in the links given 200 ms to leave."""
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        for s in [self.pull, self._tcp_pull]:
            if s is not None:
                try:
                    self.loop.remove_reader(s.FD)
                except (ValueError, zmq.ZMQError):
                    pass
        for link in self.links.values():
            link.sock.close(linger=200)  # let the goodbye and the last frames out
        if self.pull is not None:
            self.pull.close(linger=0)
        if self._tcp_pull is not None:
            self._tcp_pull.close(linger=0)
        for mon, _, _ in self.monitors:
            mon.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        if self.ctx is not None:
            self.ctx.term()


def _event_name(event: int) -> str:
    for name in ("EVENT_HANDSHAKE_FAILED_AUTH", "EVENT_HANDSHAKE_FAILED_PROTOCOL",
                 "EVENT_HANDSHAKE_FAILED_NO_DETAIL"):
        if getattr(zmq, name, None) == event:
            return name[len("EVENT_"):].lower()
    return str(event)

