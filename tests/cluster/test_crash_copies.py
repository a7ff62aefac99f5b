"""A crash must not lose what another worker acknowledged, even if this worker never logged its copy."""

from __future__ import annotations

import os
import signal
import uuid

from tests.cluster.conftest import client_worker
from tests.helpers import Client


def test_copies_lost_in_a_crash_are_restored_from_the_origin_router(start_broker, tmp_path):
    data = str(tmp_path / "data")
    broker = start_broker("--fsync", "always", workers=2, data_dir=data)
    u = uuid.uuid4().hex[:6]
    name = f"holder{u}"
    sub = Client(broker.port, name, clean=False).connect()
    sub.subscribe(f"cc{u}/#", 1)
    home = client_worker(broker, sub)
    sub.disconnect()
    pub = None
    for i in range(40):  # a publisher on the other worker
        c = Client(broker.port, f"p{u}{i}").connect()
        if client_worker(broker, c) != home:
            pub = c
            break
        c.disconnect()
    assert pub is not None, "no publisher landed on the other worker"
    # The session's worker stops: it never logs the copies of what the other worker acknowledges.
    os.kill(home, signal.SIGSTOP)
    try:
        for i in range(30):
            pub.publish(f"cc{u}/x", str(i), qos=1)  # acknowledged once durable on the publisher's router
    finally:
        broker.kill()  # the whole broker crashes; the stopped worker dies with its copies unwritten
        try:
            os.kill(home, signal.SIGCONT)
        except ProcessLookupError:
            pass
    broker.start()
    back = Client(broker.port, name, clean=False).connect()
    assert back.session_present
    msgs = back.wait_messages(30, timeout=20)
    assert [int(m.payload) for m in msgs] == list(range(30))
    broker.wait_log("restored 30 message(s)")
