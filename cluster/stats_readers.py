"""`brokerd stats`'s reading of the routers' stats sockets: SUB sockets on one node's routers
(``StatsReader``), and several nodes read together (``Readers``), each wait bounded.

A reader need not be told how many routers a node has: each snapshot names the router count, and
the routers not yet connected to are found from it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable
from typing import Any

import msgpack
import zmq

from .paths import effective_interval, router_endpoint, run_dir
from .stats_schema import SCHEMA_VERSION, TOPIC_CONNECTIONS, TOPIC_SNAPSHOT

WAIT_SLACK_S = 2.0


class StatsReader:
    """SUB sockets on a node's routers; finds the routers it was not told about from snapshots.

    ``run_path``: the node's run directory when it is not this user's own (found by ``local_nodes``)."""

    def __init__(self, config: Any, node: tuple[str, int] | None = None, *, connections: bool = False,
                 workers: int | None = None, run_path: str | None = None) -> None:
        if node is not None:
            config = dataclasses.replace(config, stats_port=node[1])
        self.config = config
        self.host = node[0] if node is not None else None
        self.run_path = run_path or run_dir(config)
        # What tells this node from others of the same id (two brokers "t" on one host, on two ports).
        self.label = f"{node[0]}:{node[1]}" if node is not None else os.path.basename(self.run_path)
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.IPV6, 1)
        self.sub.setsockopt(zmq.SUBSCRIBE, TOPIC_SNAPSHOT)
        if connections:
            self.sub.setsockopt(zmq.SUBSCRIBE, TOPIC_CONNECTIONS)
        self.endpoints: dict[int, str] = {}
        self.routers: int | None = workers
        self.interval = effective_interval(config)
        for i in self._initial_indices(workers):
            self._connect(i)

    def _initial_indices(self, workers: int | None) -> set[int]:
        indices = {0}
        if workers:
            indices.update(range(workers))
        if not self.config.stats_port:
            try:
                names = os.listdir(self.run_path)
            except OSError:
                names = []
            for name in names:
                if name.startswith("w") and name.endswith(".stats") and name[1:-6].isdigit():
                    indices.add(int(name[1:-6]))
        return indices

    def endpoint(self, index: int) -> str:
        if not self.config.stats_port:
            return f"ipc://{self.run_path}/w{index}.stats"
        return router_endpoint(self.config, index, host=self.host)

    def _connect(self, index: int) -> None:
        if index not in self.endpoints:
            endpoint = self.endpoint(index)
            self.endpoints[index] = endpoint
            self.sub.connect(endpoint)

    def expected(self) -> list[int]:
        return list(range(self.routers)) if self.routers else sorted(self.endpoints)

    def wait_bound(self) -> float:
        return 2 * self.interval + WAIT_SLACK_S

    def receive(self, timeout: float) -> list[tuple[bytes, dict[str, Any]]]:
        """What arrives within ``timeout`` seconds (at least one message, unless it times out)."""
        if not self.sub.poll(int(max(0.0, timeout) * 1000)):
            return []
        return self.drain()

    def drain(self) -> list[tuple[bytes, dict[str, Any]]]:
        """What has arrived (without waiting)."""
        out: list[tuple[bytes, dict[str, Any]]] = []
        while True:
            try:
                topic, data = self.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return out
            try:
                body = msgpack.unpackb(data, raw=False)
            except (ValueError, msgpack.UnpackException):
                continue
            if not isinstance(body, dict) or body.get("v") != SCHEMA_VERSION:
                continue  # a router of another schema version: not ours to guess
            if topic == TOPIC_SNAPSHOT:
                routers = body.get("routers")
                if isinstance(routers, int) and routers > 0:
                    if self.routers is None or routers > self.routers:
                        self.routers = routers
                    for i in range(routers):
                        self._connect(i)
                interval = body.get("interval")
                if isinstance(interval, (int, float)) and interval > self.interval:
                    self.interval = float(interval)
            out.append((topic, body))

    def collect(self, topic: bytes = TOPIC_SNAPSHOT) -> tuple[dict[int, dict[str, Any]], list[int]]:
        """One message of kind ``topic`` from each router: (index → body, indices that stayed silent)."""
        got, missing = Readers([self]).collect(topic)
        return {i: body for (_, i), body in got.items()}, [i for _, i in missing]

    def close(self) -> None:
        self.sub.close(0)
        self.ctx.term()


class Readers:
    """Several nodes' StatsReaders, read together."""

    def __init__(self, readers: list[StatsReader]) -> None:
        self.readers = readers
        self.poller = zmq.Poller()
        for r in readers:
            self.poller.register(r.sub, zmq.POLLIN)

    @property
    def interval(self) -> float:
        return max((r.interval for r in self.readers), default=1.0)

    def wait_bound(self) -> float:
        return max((r.wait_bound() for r in self.readers), default=WAIT_SLACK_S)

    def receive(self, timeout: float) -> list[tuple[tuple[str, int], bytes, dict[str, Any]]]:
        """What arrives within ``timeout`` seconds: ((node label, router index), topic, body)."""
        ready = dict(self.poller.poll(int(max(0.0, timeout) * 1000)))
        out = []
        for r in self.readers:
            if r.sub in ready:
                out += [((r.label, body.get("index", -1)), t, body) for t, body in r.drain()]
        return out

    def expected(self) -> list[tuple[StatsReader, int]]:
        return [(r, i) for r in self.readers for i in r.expected()]

    def complete(self, keys: Iterable[tuple[str, int]]) -> bool:
        """Whether ``keys`` ((label, index) pairs) cover every router of every reader."""
        have = set(keys)
        return all(r.routers is not None for r in self.readers) and \
            all((r.label, i) in have for r, i in self.expected())

    def collect(self, topic: bytes = TOPIC_SNAPSHOT) -> tuple[dict[tuple[str, int], dict[str, Any]],
                                                              list[tuple[str, int]]]:
        """One message of kind ``topic`` from each router of each node: ((label, index) → body, the
        (label, index) pairs that stayed silent)."""
        got: dict[tuple[str, int], dict[str, Any]] = {}
        start = time.monotonic()
        while True:
            left = start + self.wait_bound() - time.monotonic()
            for key, t, body in self.receive(left):
                if t == topic:
                    got[key] = body
            if self.complete(got):
                return got, []
            if left <= 0:
                return got, [(r.label, i) for r, i in self.expected() if (r.label, i) not in got]

    def where(self, missing: Iterable[tuple[str, int]]) -> list[str]:
        by_label = {r.label: r for r in self.readers}
        return [f"{label} w{i} ({by_label[label].endpoints.get(i, '?')})" for label, i in missing]

    def close(self) -> None:
        for r in self.readers:
            r.close()
