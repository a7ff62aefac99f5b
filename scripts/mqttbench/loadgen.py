"""The load generator: one process of it, driving the clients of a plan on raw sockets with uvloop.

Built so the generator is not the bottleneck:
- publishers write pre-encoded PUBLISH packets in large pipelined batches (one ``transport.write``
  for up to 64 KiB of packets) and stop when the transport's buffer is above its high-water mark
  (``pause_writing``) or their group's flow-control window is used up;
- subscribers count packets from fixed headers only; QoS 1 subscribers acknowledge a whole read
  with one write of pre-built PUBACKs;
- the process measures its own CPU time over the measuring window, so the coordinator can flag a
  run in which the generator, not the broker, was saturated.

Several processes share flow-control state through shared-memory counters (one writer per slot):
a group whose publisher and subscribers live in different processes still has one window.
The coordinator talks to each process over a pipe: ready -> go(t0, w0, w1) -> result.
"""

from __future__ import annotations

import asyncio
import os
import resource
import struct
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from . import mqtt_wire as wire
from .brokers import client_tls_context, port_sockets
from .scenarios import ClientSpec, GroupSpec, Plan

WRITE_HIGH_WATER = 256 * 1024
BATCH_BYTES = 64 * 1024
MANY_PUBLISHERS = 200  # beyond this many publishers in a process (a fleet), the tick visits each once a period
MAX_MISSES = 16  # reads whose packets differ in size before a subscriber stops trying count_same
PLACE_ROUNDS_PER_WORKER = 40  # reconnect rounds (per broker worker) to place clients for --placement
STALL_S = 0.5  # no delivery for this long while blocked: count the window as lost and go on
CONNECT_TIMEOUT_S = 10.0
RECONNECT_WINDOW_S = 30.0  # a client closed before its CONNACK tries again this long at most ...
RECONNECT_PAUSE_S = 0.1  # ... this long after each attempt


class Refused(ConnectionError):
    """The broker answered and said no (CONNACK or SUBACK): not worth trying again."""



def raise_fd_limit() -> int:
    """Lift the soft open-file limit to the hard one: `conn` holds thousands of sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def cpu_seconds_self() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class Group:
    """Runtime state of a GroupSpec in this process: counters and the shared window."""

    __slots__ = (
        "spec", "fan", "window", "pub", "dlv", "local_only", "base", "slot", "procs", "shared_pub",
        "shared_dlv", "publishers", "forgiven", "last_total", "last_progress", "stalls", "min_chunk", "turn",
    )

    def __init__(self, spec: GroupSpec, proc: int, procs: int, local_only: bool, shared_pub: Any, shared_dlv: Any):
        self.spec = spec
        self.fan = spec.fan
        self.window = spec.window
        self.pub = 0
        self.dlv = 0
        self.local_only = local_only
        self.procs = procs
        self.base = spec.gid * procs
        self.slot = self.base + proc
        self.shared_pub = shared_pub
        self.shared_dlv = shared_dlv
        self.publishers: list[Publisher] = []
        self.forgiven = 0.0
        self.last_total = 0
        self.last_progress = time.monotonic()
        self.stalls = 0
        self.min_chunk = 1
        self.turn = 0

    def add_pub(self, n: int) -> None:
        self.pub += n
        if not self.local_only:
            self.shared_pub[self.slot] = self.pub

    def add_dlv(self, n: int) -> None:
        self.dlv += n
        if not self.local_only:
            self.shared_dlv[self.slot] = self.dlv
        pubs = self.publishers
        n = len(pubs)
        if n == 1:
            pubs[0].pump()
        elif n > MANY_PUBLISHERS:
            return  # a fleet: its devices send on their own clocks (``Worker._tick``), not on deliveries
        elif n:
            # Take turns: whoever pumps first takes the credit, so the first in line rotates.
            self.turn = turn = (self.turn + 1) % n
            for i in range(n):
                pubs[(turn + i) % n].pump()

    def totals(self) -> tuple[int, int]:
        if self.local_only:
            return self.pub, self.dlv
        b, e = self.base, self.base + self.procs
        return sum(self.shared_pub[b:e]), sum(self.shared_dlv[b:e])

    def outstanding(self) -> float:
        """Messages per subscriber published but not yet delivered (minus those given up as lost)."""
        if self.local_only:
            return self.pub - self.dlv / self.fan - self.forgiven
        pub, dlv = self.totals()
        return pub - dlv / self.fan - self.forgiven

    def check_stall(self, now: float) -> None:
        """If the window is used up and nothing arrived for STALL_S, deliveries were lost: reopen it."""
        _, dlv = self.totals()
        if dlv != self.last_total:
            self.last_total = dlv
            self.last_progress = now
            return
        if now - self.last_progress < STALL_S:
            return
        gap = self.outstanding()
        if gap > self.window - self.min_chunk:
            self.forgiven += gap
            self.stalls += 1
            self.last_progress = now
            for p in self.publishers:
                p.pump()


class Conn(asyncio.Protocol):
    """One MQTT connection. Handshake packets are parsed fully; after that ``on_data`` is swapped for
    the role's fast handler."""

    def __init__(self, on_lost: Callable[[Conn, Exception | None], None]) -> None:
        self.transport: asyncio.Transport | None = None
        self.paused = False
        self.lost = False
        self.buf = b""
        self.on_data: Callable[[bytes], None] = self._handshake_data
        self.on_resume: Callable[[], None] | None = None
        self._on_lost = on_lost
        self._waiting: tuple[int, asyncio.Future[tuple[int, bytes]]] | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_HIGH_WATER // 4)

    def data_received(self, data: bytes) -> None:
        self.on_data(data)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.on_resume is not None:
            self.on_resume()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.paused = True
        if self._waiting is not None and not self._waiting[1].done():
            self._waiting[1].set_exception(ConnectionError(f"connection lost during handshake: {exc}"))
        self._on_lost(self, exc)

    # handshake
    def _handshake_data(self, data: bytes) -> None:
        self.buf += data
        packets, pos = wire.iter_packets(self.buf)
        for first, body, end in packets:
            if self._waiting is not None and first >> 4 == self._waiting[0] and not self._waiting[1].done():
                self._waiting[1].set_result((first, self.buf[body:end]))
        self.buf = self.buf[pos:]

    async def request(self, packet: bytes, expect: int, timeout: float) -> bytes:
        """Write ``packet`` and return the body of the next packet of type ``expect``."""
        assert self.transport is not None
        if self.transport.is_closing():  # the broker closed it as soon as it was accepted
            # (before a future is made: one failed by connection_lost with no one awaiting it
            # printed "Future exception was never retrieved" for every refused connect)
            raise ConnectionError("connection closed before the handshake")
        fut: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self._waiting = (expect, fut)
        self.transport.write(packet)
        try:
            _, body = await asyncio.wait_for(fut, timeout)
        finally:
            self._waiting = None
        return body

    def take_buffer(self) -> bytes:
        buf, self.buf = self.buf, b""
        return buf

    def close(self) -> None:
        if self.transport is not None and not self.lost:
            try:
                self.transport.write(wire.DISCONNECT_PACKET)
            finally:
                self.transport.close()


class Publisher:
    """Writes pre-encoded PUBLISH packets as fast as its group's window (and QoS 1 inflight) allow."""

    __slots__ = (
        "conn", "group", "qos", "rate", "inflight", "sent", "acked", "running", "t_start", "plen",
        "max_batch", "blob", "ring", "ring_size", "ring_pos", "buf", "cap",
    )

    def __init__(
        self, conn: Conn, group: Group, topic: str, payload: bytes, qos: int, inflight: int, rate: float, cap: int = 0
    ) -> None:
        """``cap``: most messages per write (0: no cap) - a group's publishers share its window fairly."""
        self.conn = conn
        self.group = group
        self.qos = qos
        self.rate = rate
        self.inflight = inflight
        self.sent = 0
        self.acked = 0
        self.running = False
        self.t_start = 0.0
        self.buf = b""
        if qos == 0:
            packet = wire.publish(topic, payload)
            self.plen = len(packet)
            self.max_batch = max(1, BATCH_BYTES // self.plen)
            self.blob = memoryview(packet * self.max_batch)
            self.ring = self.blob
            self.ring_size = 0
        else:
            # A ring of packets with ids 1..ring_size; an id is reused only after the broker acked it
            # (acks arrive in order and the inflight window is below the ring size).
            self.ring_size = min(0xFFFF, max(2 * inflight, 256))
            packets = [wire.publish(topic, payload, qos=qos, packet_id=i + 1) for i in range(self.ring_size)]
            self.plen = len(packets[0])
            self.max_batch = max(1, min(BATCH_BYTES // self.plen, inflight))
            self.ring = memoryview(b"".join(packets))
            self.blob = self.ring
        self.ring_pos = 0
        self.cap = min(cap, self.max_batch) if cap > 0 else self.max_batch
        conn.on_resume = self.pump
        conn.on_data = self._acks if qos else self._ignore

    def start(self, t_start: float) -> None:
        self.t_start = t_start
        self.running = True
        self.pump()

    def pump(self) -> None:
        conn = self.conn
        if not self.running or conn.paused:
            return
        group = self.group
        min_chunk = group.min_chunk
        while True:
            credit = group.window - group.outstanding()
            if self.rate:
                credit = min(credit, self.rate * (time.monotonic() - self.t_start) - self.sent)
            if self.qos:
                credit = min(credit, self.inflight - (self.sent - self.acked))
            if credit < min_chunk:
                return
            n = min(int(credit), self.cap)
            self._write(n)
            self.sent += n
            group.add_pub(n)
            if conn.paused:
                return

    def _write(self, n: int) -> None:
        transport = self.conn.transport
        assert transport is not None
        plen = self.plen
        if not self.ring_size:
            transport.write(self.blob if n == self.max_batch else self.blob[: n * plen])
            return
        start = self.ring_pos
        end = start + n
        if end <= self.ring_size:
            transport.write(self.ring[start * plen : end * plen])
        else:
            transport.write(self.ring[start * plen :])
            transport.write(self.ring[: (end - self.ring_size) * plen])
        self.ring_pos = end % self.ring_size

    def _ignore(self, data: bytes) -> None:
        pass

    def _acks(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        count, pos = wire.count_packets(buf)
        self.buf = buf[pos:]
        if count:
            self.acked += count
            self.pump()


class Subscriber:
    """Counts deliveries from fixed headers; at QoS 1 also acknowledges them, one write per read."""

    __slots__ = ("conn", "group", "buf", "received", "prefix", "bad", "same", "misses")

    def __init__(self, conn: Conn, group: Group, qos: int, topic_filter: str) -> None:
        self.conn = conn
        self.group = group
        self.buf = conn.take_buffer()
        self.received = 0
        if topic_filter.startswith("$share/"):  # deliveries carry the topic, not the share name
            topic_filter = topic_filter.split("/", 2)[2]
        self.prefix = topic_filter.rstrip("#").encode()
        self.bad = 0
        self.same: tuple[int, bytes] | None = None  # (length, fixed header) of the packets seen
        self.misses = 0  # reads where count_same did not apply (fanin: several topics)
        conn.on_data = self._qos1 if qos else self._qos0

    def _check(self, buf: bytes) -> None:
        """First packet of each read: a PUBLISH on the subscribed topic, or the stream is wrong."""
        topic = wire.publish_topic(buf)
        if topic is not None and not (topic and topic.startswith(self.prefix)):
            self.bad += 1

    def _qos0(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        self._check(buf)
        same = self.same
        count = -1
        if same is not None:
            count, pos = wire.count_same(buf, 0, *same)
            if count < 0:
                self.misses += 1
                if self.misses > MAX_MISSES:
                    self.same = None  # packets differ in size here: count them one by one
        elif self.misses <= MAX_MISSES:
            first = wire.fixed_header(buf)  # the first packet's shape, tried on the next reads
            if first is not None:
                self.same = (first[1], first[0])
        if count < 0:
            count, pos = wire.count_packets(buf)
        self.buf = buf[pos:] if pos < len(buf) else b""
        if count:
            self.received += count
            self.group.add_dlv(count)

    def _qos1(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        self._check(buf)
        n = len(buf)
        pos = 0
        count = 0
        acks = []
        pubacks = wire.PUBACKS
        while pos + 2 <= n:
            rl = buf[pos + 1]
            if rl < 0x80:
                body = pos + 2
            elif pos + 3 <= n and buf[pos + 2] < 0x80:
                rl = (rl & 0x7F) | (buf[pos + 2] << 7)
                body = pos + 3
            else:
                dec = wire.decode_remaining_length(buf, pos + 1)
                if dec is None:
                    break
                rl, body = dec
            end = body + rl
            if end > n:
                break
            first = buf[pos]
            if first >> 4 == wire.PUBLISH:
                count += 1
                if first & 0x06:
                    at = body + 2 + ((buf[body] << 8) | buf[body + 1])
                    acks.append(pubacks[(buf[at] << 8) | buf[at + 1]])
            pos = end
        self.buf = buf[pos:] if pos < n else b""
        if acks and self.conn.transport is not None and not self.conn.lost:
            self.conn.transport.write(b"".join(acks))
        if count:
            self.received += count
            self.group.add_dlv(count)


class LatencyProbe:
    """The side channel: a timer-driven publisher stamping perf_counter_ns (CLOCK_MONOTONIC, so the
    same clock in every process) into each payload, and the subscriber that times arrivals."""

    def __init__(self, pub: Conn, sub: Conn, topic: str, payload_size: int, rate: float) -> None:
        self.pub = pub
        self.sub = sub
        self.prefix_topic = topic
        self.pad = b"\x00" * max(0, payload_size - 8)
        self.interval = 1.0 / rate
        self.sent = 0
        self.received = 0
        self.samples: list[int] = []
        self.window_ns = (0, 0)
        self.running = False
        self.buf = sub.take_buffer()
        self._handle: asyncio.TimerHandle | None = None
        self._next = 0.0
        sub.on_data = self._data

    def start(self, t0: float, w0: float, w1: float) -> None:
        # monotonic() and perf_counter_ns() read the same clock on Linux; keep the window in ns.
        self.window_ns = (int(w0 * 1e9), int(w1 * 1e9))
        self.running = True
        self._next = t0
        self._tick()

    def stop(self) -> None:
        self.running = False
        if self._handle is not None:
            self._handle.cancel()

    def _tick(self) -> None:
        if not self.running or self.pub.lost or self.pub.transport is None:
            return
        stamp = struct.pack(">Q", time.perf_counter_ns())
        self.pub.transport.write(wire.publish(self.prefix_topic, stamp + self.pad))
        self.sent += 1
        self._next += self.interval
        delay = max(0.0, self._next - time.monotonic())
        self._handle = asyncio.get_running_loop().call_later(delay, self._tick)

    def _data(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        buf = self.buf + data if self.buf else data
        packets, pos = wire.iter_packets(buf)
        self.buf = buf[pos:]
        lo, hi = self.window_ns
        for first, body, _end in packets:
            if first >> 4 != wire.PUBLISH:
                continue
            at = body + 2 + ((buf[body] << 8) | buf[body + 1]) + (2 if first & 0x06 else 0)
            sent = int.from_bytes(buf[at : at + 8], "big")
            self.received += 1
            if lo <= sent < hi:
                self.samples.append(now - sent)


class Worker:
    """One generator process: connects its share of the plan's clients and runs the timeline."""

    def __init__(self, plan: Plan, proc: int, pipe: Connection, shared_pub: Any, shared_dlv: Any, host: str, port: int):
        self.plan = plan
        self.proc = proc
        self.pipe = pipe
        self.host = host
        self.port = port
        self.payload = b"\xa5" * plan.payload
        self.lost_connections = 0
        self.reconnects = 0  # connects tried again after the broker closed the socket before CONNACK
        self._tls = client_tls_context()  # --tls: every connection over TLS
        self.conns: list[Conn] = []
        self.publishers: list[Publisher] = []
        self.subscribers: list[Subscriber] = []
        self.probe: LatencyProbe | None = None
        self.groups: dict[int, Group] = {}
        self.running = False
        self._tick_s = 0.005
        self._period = 1.0  # a fleet's: the slowest publisher's period (``_tick``)
        self._next_pub = 0  # a fleet's: the publishers visited so far, over all periods
        self._visits_t0 = 0.0
        procs_of: dict[int, set[int]] = {}
        for c in plan.clients:
            procs_of.setdefault(c.gid, set()).add(c.proc)
        for spec in plan.groups:
            if proc in procs_of.get(spec.gid, ()):
                local = procs_of[spec.gid] == {proc} or plan.procs == 1
                self.groups[spec.gid] = Group(spec, proc, plan.procs, local, shared_pub, shared_dlv)

    def _lost(self, conn: Conn, exc: Exception | None) -> None:
        if self.running:
            self.lost_connections += 1

    async def connect(self, spec: ClientSpec, index: int, sem: asyncio.Semaphore) -> Conn:
        """Connect (and subscribe) one client. A socket the broker closes before CONNACK (a
        connection-rate limit: brokerd's default --max-connection-rate, as EMQX's) is tried again
        after a pause, as a device's client library does, within ``RECONNECT_WINDOW_S``; a CONNACK
        or SUBACK that refuses is not."""
        deadline = time.monotonic() + RECONNECT_WINDOW_S
        while True:
            try:
                return await self._connect_once(spec, index, sem)
            except Refused:
                raise
            except (ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise
                self.reconnects += 1
                await asyncio.sleep(RECONNECT_PAUSE_S)

    async def _connect_once(self, spec: ClientSpec, index: int, sem: asyncio.Semaphore) -> Conn:
        loop = asyncio.get_running_loop()
        client_id = f"bench-{os.getpid()}-{self.proc}-{index}"
        async with sem:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: Conn(self._lost), self.host, self.port, ssl=self._tls),
                CONNECT_TIMEOUT_S
            )
            body = await conn.request(wire.connect(client_id, clean_session=spec.role != "kept"), wire.CONNACK,
                                      CONNECT_TIMEOUT_S)
            if len(body) < 2 or body[1] != 0:
                conn.close()
                raise Refused(f"CONNACK refused: return code {body[1:2].hex()}")
            if spec.role in ("sub", "lat_sub"):
                qos = self.groups[spec.gid].spec.qos
                body = await conn.request(wire.subscribe(1, spec.topic, qos), wire.SUBACK, CONNECT_TIMEOUT_S)
                if len(body) < 3 or body[2] == 0x80:
                    conn.close()
                    raise Refused(f"SUBACK refused the filter {spec.topic!r}")
        self.conns.append(conn)
        return conn

    def recv(self, timeout: float) -> tuple[Any, ...]:
        """Block for the coordinator's next message: nothing runs meanwhile, and nothing needs to."""
        if not self.pipe.poll(timeout):
            raise TimeoutError(f"generator {self.proc}: no word from the coordinator in {timeout:.0f} s")
        return self.pipe.recv()

    async def setup(self) -> None:
        sem = asyncio.Semaphore(self.plan.connect_concurrency)
        mine = list(enumerate(self.plan.clients_of(self.proc)))
        subs = [(i, c) for i, c in mine if c.role in ("sub", "lat_sub")]
        pubs = [(i, c) for i, c in mine if c.role in ("pub", "lat_pub")]
        sub_conns = await asyncio.gather(*(self.connect(c, i, sem) for i, c in subs))
        pub_conns = await asyncio.gather(*(self.connect(c, i, sem) for i, c in pubs))
        if self.plan.placement != "any":
            await self._place(subs, sub_conns, pubs, pub_conns, sem)
        lat_pub = lat_sub = None
        for (_, spec), conn in zip(subs, sub_conns, strict=True):
            group = self.groups[spec.gid]
            if spec.role == "lat_sub":
                lat_sub = (conn, spec, group)
            else:
                self.subscribers.append(Subscriber(conn, group, group.spec.qos, spec.topic))
        for (_, spec), conn in zip(pubs, pub_conns, strict=True):
            group = self.groups[spec.gid]
            if spec.role == "lat_pub":
                lat_pub = conn
                continue
            n_pubs = sum(1 for c in self.plan.clients if c.gid == spec.gid and c.role == "pub")
            rate = group.spec.rate / n_pubs if group.spec.rate else 0.0
            cap = max(1, group.window // n_pubs)
            if self.plan.per_write:  # a device's client: a write per PUBLISH (or a few)
                cap = min(cap, self.plan.per_write)
            p = Publisher(conn, group, spec.topic, self.payload, group.spec.qos, self.plan.inflight, rate, cap)
            group.publishers.append(p)
            self.publishers.append(p)
        for group in self.groups.values():
            chunk = min([group.window // 4, *(p.cap for p in group.publishers)])
            if group.spec.qos:
                chunk = min(chunk, self.plan.inflight // 4)
            group.min_chunk = 1 if group.spec.rate else max(1, chunk)
        if lat_pub is not None and lat_sub is not None:
            conn, spec, group = lat_sub
            self.probe = LatencyProbe(lat_pub, conn, spec.topic, max(8, self.plan.payload), group.spec.rate)

    async def _place(self, subs: list[tuple[int, ClientSpec]], sub_conns: list[Conn],
                     pubs: list[tuple[int, ClientSpec]], pub_conns: list[Conn], sem: asyncio.Semaphore) -> None:
        """Reconnect load clients until pair g's subscriber sits on worker g mod W and its publisher
        on the same worker ("same") or the next one ("cross"), so pairs are also spread evenly.
        The kernel spreads connections over the workers by a hash the generator cannot choose, so
        it asks the broker's processes where each one landed and retries the misplaced ones."""
        want_next = 0 if self.plan.placement == "same" else 1
        clients = [(i, spec, conns, k) for spec_list, conns in ((subs, sub_conns), (pubs, pub_conns))
                   for k, (i, spec) in enumerate(spec_list) if spec.role in ("sub", "pub")]
        attempts = 0
        while True:
            workers, owners = port_sockets(self.plan.broker_pids, self.port)
            if len(workers) < 2:
                raise RuntimeError(f"--placement {self.plan.placement} needs a broker with 2 or more workers")
            wrong = []
            for client in clients:
                _, spec, conns, k = client
                want = workers[(spec.gid + (want_next if spec.role == "pub" else 0)) % len(workers)]
                if owners.get(_local_port(conns[k])) != want:
                    wrong.append(client)
            if not wrong:
                return
            attempts += 1
            if attempts > PLACE_ROUNDS_PER_WORKER * len(workers):
                raise RuntimeError(f"could not place {len(wrong)} clients {self.plan.placement!r} "
                                   f"in {attempts - 1} reconnect rounds")
            for _, _, conns, k in wrong:
                conns[k].close()
                self.conns.remove(conns[k])
            fresh = await asyncio.gather(*(self.connect(spec, i, sem) for i, spec, _, _ in wrong))
            for (_, _, conns, k), conn in zip(wrong, fresh, strict=True):
                conns[k] = conn

    def _snapshot(self) -> dict[str, Any]:
        return {
            "t": time.monotonic(),
            "cpu": cpu_seconds_self(),
            "pub": {g: s.pub for g, s in self.groups.items() if not s.spec.side},
            "dlv": {g: s.dlv for g, s in self.groups.items() if not s.spec.side},
        }

    def _tick(self) -> None:
        if not self.running:
            return
        now = time.monotonic()
        for group in self.groups.values():
            if group.publishers:
                group.check_stall(now)
        pubs = self.publishers
        if len(pubs) <= MANY_PUBLISHERS:
            for p in pubs:
                p.pump()
        else:
            # A fleet: each publisher visited once per its period, at its own place in it (its
            # clock's phase, ``run_load``), as devices each on their own clock. The visits due by
            # the time passed, not a fixed slice per tick: ticks come late (1 ms apart at best),
            # and a fixed slice fell behind the schedule.
            n = len(pubs)
            due = int((now - self._visits_t0) * n / self._period)
            start = self._next_pub
            for i in range(start, start + min(due - start, n)):
                pubs[i % n].pump()
            self._next_pub = due
        asyncio.get_running_loop().call_later(self._tick_s, self._tick)

    async def run_load(self) -> dict[str, Any]:
        await self.setup()
        self.pipe.send(("ready", {"proc": self.proc, "connections": len(self.conns)}))
        msg = self.recv(120.0)
        if msg[0] != "go":
            raise RuntimeError(f"unexpected message {msg[0]!r}")
        _, t0, w0, w1 = msg
        cross = any(not g.local_only for g in self.groups.values())
        rated = any(g.spec.rate for g in self.groups.values() if not g.spec.side)
        self._tick_s = 0.001 if cross or rated else 0.005
        if len(self.publishers) > MANY_PUBLISHERS:
            # Pumping thousands of rated publishers every tick would cost the generator more than
            # the broker: visit each once per period of its own rate (a second at most).
            slowest = min((p.rate for p in self.publishers if p.rate), default=1.0)
            self._period = min(1.0, 1.0 / slowest)
            self._next_pub = 0
        await asyncio.sleep(max(0.0, t0 - time.monotonic()))
        start = self._snapshot()
        self.running = True
        now = time.monotonic()
        for group in self.groups.values():
            group.last_progress = now
        self._visits_t0 = now
        pubs = self.publishers
        fleet = len(pubs) > MANY_PUBLISHERS
        for i, p in enumerate(pubs):
            # A fleet's devices each keep their own clock, spread over the period: started at
            # once, all were due at the same instants, and whatever pumped first after one
            # (a delivery pumped every publisher) sent hundreds of them back to back; the
            # broker met the fleet as one burst a second, and the latency side channel's p99
            # was how long a burst took to get through.
            p.start(now + i * self._period / len(pubs) if fleet else now)
        if self.probe is not None:
            self.probe.start(now, w0, w1)
        asyncio.get_running_loop().call_later(self._tick_s, self._tick)
        await asyncio.sleep(max(0.0, w0 - time.monotonic()))
        snap0 = self._snapshot()
        await asyncio.sleep(max(0.0, w1 - time.monotonic()))
        snap1 = self._snapshot()
        for p in self.publishers:
            p.running = False
        if self.probe is not None:
            self.probe.stop()
        await self.drain()
        self.running = False
        end = self._snapshot()
        return {
            "proc": self.proc,
            "start": start,
            "w0": snap0,
            "w1": snap1,
            "end": end,
            "fan": {g: s.fan for g, s in self.groups.items() if not s.spec.side},
            "stalls": sum(g.stalls for g in self.groups.values()),
            "acked": sum(p.acked for p in self.publishers),
            "lost_connections": self.lost_connections,
            "reconnects": self.reconnects,
            "bad_reads": sum(s.bad for s in self.subscribers),
            "publisher_sent": [p.sent for p in self.publishers],
            "subscriber_received": [s.received for s in self.subscribers],
            "latency_ns": self.probe.samples if self.probe else [],
            "latency_sent": self.probe.sent if self.probe else 0,
            "latency_received": self.probe.received if self.probe else 0,
        }

    async def drain(self) -> None:
        """After the window: wait until deliveries (and QoS 1 acks) caught up, or went quiet."""
        deadline = time.monotonic() + self.plan.drain_max
        last = -1
        last_change = time.monotonic()
        while time.monotonic() < deadline:
            done = True
            total = 0
            for g in self.groups.values():
                if g.spec.side:
                    continue
                pub, dlv = g.totals()
                total += dlv
                if dlv < pub * g.fan:
                    done = False
            total += sum(p.acked for p in self.publishers)
            if all(p.acked >= p.sent for p in self.publishers if p.qos) and done:
                return
            now = time.monotonic()
            if total != last:
                last, last_change = total, now
            elif now - last_change > self.plan.drain_quiet:
                return
            await asyncio.sleep(0.02)

    async def run_conn(self) -> dict[str, Any]:
        self.pipe.send(("ready", {"proc": self.proc, "connections": 0}))
        msg = self.recv(120.0)
        if msg[0] != "go":
            raise RuntimeError(f"unexpected message {msg[0]!r}")
        mine = self.plan.clients_of(self.proc)
        sem = asyncio.Semaphore(self.plan.connect_concurrency)
        cpu0 = cpu_seconds_self()
        t_first = time.monotonic()
        results = await asyncio.gather(*(self.connect(c, i, sem) for i, c in enumerate(mine)), return_exceptions=True)
        t_last = time.monotonic()
        errors = [r for r in results if isinstance(r, BaseException)]
        info = {
            "proc": self.proc,
            "ok": len(results) - len(errors),
            "errors": len(errors),
            "first_error": repr(errors[0]) if errors else "",
            "reconnects": self.reconnects,
            "t_first": t_first,
            "t_last": t_last,
            "cpu": cpu_seconds_self() - cpu0,
        }
        self.running = True
        self.pipe.send(("connected", info))
        msg = self.recv(120.0)
        info["still_open"] = sum(1 for c in self.conns if not c.lost)
        info["lost_connections"] = self.lost_connections
        return info

    async def close_all(self) -> None:
        self.running = False
        for conn in self.conns:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing is best effort at the end of a run
                pass
        await asyncio.sleep(0.05)


def _local_port(conn: Conn) -> int:
    assert conn.transport is not None
    return conn.transport.get_extra_info("sockname")[1]


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; fall back rather than fail
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def worker_main(plan: Plan, proc: int, pipe: Connection, shared_pub: Any, shared_dlv: Any, host: str, port: int) -> None:
    """Entry point of a generator process (forked by the coordinator)."""
    raise_fd_limit()
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    worker = Worker(plan, proc, pipe, shared_pub, shared_dlv, host, port)
    try:
        run = worker.run_conn() if plan.is_conn else worker.run_load()
        result = loop.run_until_complete(run)
        loop.run_until_complete(worker.close_all())
        pipe.send(("result", result))
    except BaseException as exc:  # report every failure to the coordinator, then exit
        try:
            pipe.send(("error", f"generator {proc}: {type(exc).__name__}: {exc}"))
        except OSError:
            pass
    finally:
        loop.close()
        pipe.close()
