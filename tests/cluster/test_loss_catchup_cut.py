"""A persistent session's catch-up cut short: its client reconnects to a backlog in the log, gets
a window's worth, and its connection fails before it acknowledged any. The next connection, on
the same worker or on the other one, gets every message the publisher was acknowledged for.

Why: the catch-up reads the log ahead of the window (256 records a read) and queues what does not
fit, its cursor past them. The connection's end dropped the queue and kept the cursor, so no
later connection read those records again: a client whose connection failed in the middle of a
catch-up lost up to a read's worth of acknowledged messages (here 236 of the 600, on either
worker). The unit tests with the parts: tests/unit/test_loss_catchup_detach.py.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.cluster.test_move_under_load import read_all, seq_of
from tests.integration.test_mqtt5 import PUBLISH, raw_on

BACKLOG = 600  # more than one read ahead (256 records) past the window (20)


@pytest.mark.parametrize("where", ["same worker", "other worker"])
def test_a_catch_up_cut_short_loses_nothing(start_broker, where):
    broker = start_broker("--log", "on")
    u = uuid.uuid4().hex[:6]
    name, topic = f"cut-{u}", f"cut{u}/t"
    sub = raw_on(broker, level=4)
    assert not sub.connect(name, clean=False).session_present
    assert sub.subscribe([(topic, 1)]).codes == [1]
    home = sub.worker
    sub.close()  # offline: the backlog waits in the log of ``home``
    pub = raw_on(broker, on=home, level=4)
    pub.connect(f"cutp-{u}")
    for i in range(BACKLOG):
        pub.publish(topic, f"a:{i:06d}:".encode(), 1)  # (returns once acknowledged)
    # The next connection's window fills at once; the rest of the read waits in the queue.
    cut = raw_on(broker, on=home, level=4)
    assert cut.connect(name, clean=False).session_present
    first: list[int] = []
    deadline = time.monotonic() + 10
    while len(first) < 20 and time.monotonic() < deadline:
        pkt = cut.recv(deadline - time.monotonic())
        if pkt.kind == PUBLISH:
            first.append(seq_of(pkt.payload)[1])
    assert first == list(range(20)), "the catch-up did not start where the backlog did"
    cut.close()  # without acknowledging any: to the broker, the network failed
    then = raw_on(broker, on=home, level=4) if where == "same worker" else raw_on(broker, off=home, level=4)
    assert then.connect(name, clean=False).session_present
    got = read_all(then, {"a": set(range(BACKLOG))}, 60)
    assert len(got) >= BACKLOG
