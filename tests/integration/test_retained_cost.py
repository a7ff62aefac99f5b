"""What retained messages and subscriptions cost a worker: the limits charge what is held, and one
client's big SUBSCRIBE (many filters, or a '#' over many retained messages) holds nobody else up."""

from __future__ import annotations

import time

from brokerd.router.limits import retained_size
from brokerd.router.message import Message
from tests.helpers import Client, cid, wait_for
from tests.integration.test_limits import STATS, _until_limit

LEVELS = 127  # within --max-topic-levels (128)


def _deep(i: int) -> str:
    return "/".join([f"d{i:03d}"] + [f"l{j}" for j in range(1, LEVELS)])


def test_deep_retained_topics_are_charged_what_they_hold(start_broker):
    """--max-retained-bytes 64K: 127-level topics (~550 B) with 16 B payloads. Before, a message
    counted its topic and payload (566 B), so all 40 were retained while holding ~1.6 MB; now
    each is charged what it holds (~3.3 KB) and the limit stops them at what fits."""
    limit = 64 * 1024
    payload = b"p" * 16
    fits = limit // retained_size(Message(_deep(0), payload))
    assert 5 < fits < 40
    broker = start_broker("--max-retained-bytes", str(limit), *STATS)
    pub = Client(broker.port, cid("deep-pub")).connect()
    for i in range(40):
        pub.publish(_deep(i), payload, qos=1, retain=True)
    _until_limit(broker, "retained", 40 - fits)
    late = Client(broker.port, cid("deep-late")).connect()
    late.subscribe("#", 0)
    got = late.wait_messages(fits)
    time.sleep(0.5)  # anything beyond what fits would have come by now
    assert sorted(m.topic for m in late.messages) == [_deep(i) for i in range(fits)]
    assert len(got) >= fits
    pub.publish(_deep(0), b"", qos=1, retain=True)  # clearing one makes room for one more
    pub.publish(_deep(39), payload, qos=1, retain=True)
    again = Client(broker.port, cid("deep-again")).connect()
    again.subscribe(_deep(39), 0)
    wait_for(lambda: [m.topic for m in again.messages] == [_deep(39)], what="the topic retained after the clearing")
