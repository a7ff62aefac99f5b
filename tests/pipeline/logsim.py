"""Known traffic written straight into commit logs, for tests that must not depend on a broker.

``LogSim`` writes what a broker with several routers would: the origin record on the router a
client published to, and a forwarded copy (carrying the origin router and offset) on every router
that has subscribers for it. It remembers every message, so a test can compare a Spark read with
exactly what was written.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokerd.router.log import CommitLog


@dataclass(frozen=True)
class Sent:
    """One message as published (its origin record)."""

    router_id: str
    offset: int
    timestamp_ms: int
    client_id: str
    topic: str
    qos: int
    retain: bool
    payload: bytes
    properties: bytes = b""   # MQTT 5 properties as the broker logs them (msgpack; b"": none)


class LogSim:
    """Synchronous CommitLogs under ``<data_dir>/<node>/<router>/``.

    Each log is flushed after every ``batch_records`` appends to it, as the broker flushes once per
    loop iteration: the records lie in batches of several (format version 2 writes one batch per
    flush), and a test that damages the last record damages a batch of one."""

    def __init__(self, data_dir: str | Path, node: str = "t", routers: tuple[str, ...] = ("w0", "w1"),
                 segment_bytes: int = 64 << 20, index_interval_bytes: int = 4096,
                 batch_records: int = 7) -> None:
        self.data_dir = str(data_dir)
        self.node = node
        self.batch_records = batch_records
        self.logs: dict[str, CommitLog] = {}
        for r in routers:
            directory = os.path.join(self.data_dir, node, r)
            os.makedirs(directory, exist_ok=True)
            self.logs[r] = CommitLog(directory, router_id=f"{node}/{r}", loop=None, fsync="never",
                                     segment_bytes=segment_bytes, index_interval_bytes=index_interval_bytes)
        self.sent: list[Sent] = []
        self.logged: list[tuple[str, int, Sent]] = []  # (router id, offset there, message): every record

    def publish(self, router: str, topic: str, payload: bytes, *, client_id: str = "c",
                qos: int = 0, retain: bool = False, timestamp_ms: int | None = None,
                forward_to: tuple[str, ...] = (), properties: bytes = b"") -> Sent:
        ts = timestamp_ms if timestamp_ms is not None else time.time_ns() // 1_000_000
        rid = f"{self.node}/{router}"
        off = self._append(router, topic, payload, qos=qos, retain=retain, client_id=client_id,
                           timestamp_ms=ts, properties=properties)
        sent = Sent(rid, off, ts, client_id, topic, qos, retain, payload, properties)
        self.sent.append(sent)
        self.logged.append((rid, off, sent))
        for other in forward_to:
            copy = self._append(other, topic, payload, qos=qos, retain=retain, client_id=client_id,
                                origin_router=rid, origin_offset=off, timestamp_ms=ts, properties=properties)
            self.logged.append((f"{self.node}/{other}", copy, sent))
        return sent

    def _append(self, router: str, topic: str, payload: bytes, **kw: Any) -> int:
        log = self.logs[router]
        off = log.append(topic, payload, **kw)
        if (off + 1) % self.batch_records == 0:
            log.flush()
        return off

    def flush(self) -> None:
        for log in self.logs.values():
            log.flush()

    def close(self) -> None:
        for log in self.logs.values():
            log.close()
