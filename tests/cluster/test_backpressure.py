"""Mesh backpressure: a peer router that stops reading pauses only the publishers that feed it."""

from __future__ import annotations

import os
import signal
import uuid

from tests.cluster.conftest import client_worker
from tests.helpers import Client, freeze


def test_stopped_peer_pauses_its_publishers_and_nothing_is_lost(start_broker):
    broker = start_broker("--mesh-hwm", "2", "--mesh-timeout", "60", "--max-queued", "100000", workers=2)
    u = uuid.uuid4().hex[:6]
    # Place clients: a subscriber on each worker, publishers on the worker that keeps running.
    clients = [Client(broker.port, f"c{u}-{i}").connect() for i in range(16)]
    by: dict[int, list[Client]] = {}
    for c in clients:
        by.setdefault(client_worker(broker, c), []).append(c)
    assert len(by) == 2, "connections did not spread over both workers"
    (w_run, on_run), (w_stop, on_stop) = sorted(by.items(), key=lambda kv: -len(kv[1]))
    assert len(on_run) >= 4 and on_stop
    s_local, s2, p1, p2 = on_run[:4]
    s_remote = on_stop[0]
    s_local.subscribe(f"bp{u}/t", 1)
    s_remote.subscribe(f"bp{u}/t", 1)
    s2.subscribe(f"bp{u}/other", 1)

    freeze(w_stop)
    try:
        n = 5000
        payload = b"x" * 1000
        for i in range(n):
            p1.c.publish(f"bp{u}/t", i.to_bytes(4, "big") + payload, qos=1)
        # Other traffic on the running worker flows while the peer is stopped ...
        for i in range(100):
            p2.publish(f"bp{u}/other", str(i), qos=1)
        assert len(s2.wait_messages(100)) == 100
        # ... but the publisher feeding the stopped peer is held back, not buffered without bound.
        assert len(s_local.messages) < n, len(s_local.messages)
    finally:
        os.kill(w_stop, signal.SIGCONT)
    for s in (s_local, s_remote):
        msgs = s.wait_messages(n, timeout=60)
        assert [int.from_bytes(m.payload[:4], "big") for m in msgs] == list(range(n))
