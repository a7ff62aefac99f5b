"""No Local (MQTT 5) across two routers: a No Local subscription keeps the subscriber's own
messages from it, and nothing else, whichever router the publisher is on.

Reported: with ``--workers 2`` a client that subscribed with No Local missed a message that
another client, on the other worker, published "a moment later". No Local compares the
publisher's client id with the subscriber's (``Router._deliver``; ``deliver_forwarded`` for the
plain form, whose third value is the publisher's id), and two clients never share one, so it
cannot drop the other client's message. What the cluster promises is delivery of what is
published after the SUBACK: the subscriber's router sends the SUBACK only once every other router
has acknowledged its interest in the filter (``Client._suback_when_acked``), so a PUBLISH that the
other router reads after that is forwarded. A message published before the SUBACK has arrived (a
"moment later" than the SUBSCRIBE, not than the SUBACK) may miss it: the interest is still on its
way to the other router.
"""

from __future__ import annotations

import paho.mqtt.client as mqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.cluster.conftest import client_worker
from tests.helpers import WAIT, Broker, Client, cid, wait_for

V5, V311 = mqtt.MQTTv5, mqtt.MQTTv311
ROUNDS = 50
# The publisher's protocol and QoS select how the message crosses the mesh (mesh_format.to_mesh):
# MQTT 3.1.1 QoS 0 as its packet, MQTT 3.1.1 QoS 1 as head and payload (both the plain form, which
# deliver_forwarded checks against No Local itself), MQTT 5 as the full form (Router._deliver).
FORMS = [(V311, 0), (V311, 1), (V5, 0), (V5, 1)]


def one_per_worker(broker: Broker, prefix: str, protocol: int) -> dict[int, Client]:
    """A connected client on each of the broker's two workers: new connections until the kernel
    has put one on each (bounded); the extra ones are closed."""
    found: dict[int, Client] = {}

    def another() -> bool:
        c = Client(broker.port, cid(prefix), protocol=protocol).connect()
        worker = client_worker(broker, c)
        if worker in found:
            c.disconnect()
        else:
            found[worker] = c
        return len(found) == 2

    wait_for(another, WAIT, f"{prefix} clients on both workers")
    return found


def test_no_local_subscriber_gets_another_routers_publish_sent_right_after_its_suback(start_broker):
    broker = start_broker(workers=2)
    subs = one_per_worker(broker, "nls", V5)
    pubs = {protocol: one_per_worker(broker, f"nlp{protocol}", protocol) for protocol in (V311, V5)}
    w0, w1 = sorted(subs)
    u = cid("nl")
    last: dict[int, str] = {}  # each subscriber's latest filter
    for i in range(ROUNDS):
        here, there = (w0, w1) if i % 2 == 0 else (w1, w0)
        protocol, qos = FORMS[i // 2 % len(FORMS)]
        sub, pub = subs[here], pubs[protocol][there]
        topic = last[here] = f"{u}/{i}"
        # A new filter each round: each SUBSCRIBE announces new interest to the other router.
        assert sub.subscribe(topic, options=SubscribeOptions(qos=1, noLocal=True)) == [1]
        pub.publish(topic, f"other {i}", qos=qos)  # at once, on the other router
        sub.publish(topic, f"own {i}", qos=1)  # acknowledged: handled (and not delivered) by now
        m = sub.wait_payload(f"other {i}".encode())
        assert (m.topic, m.qos) == (topic, qos), f"round {i}: {m.topic} at QoS {m.qos}"
    # Whatever own message a router delivered was handed to the subscriber's connection before its
    # PUBACK, so before these last messages from the other router: none came back.
    for here, there in ((w0, w1), (w1, w0)):
        pubs[V5][there].publish(last[here], f"last {here}", qos=1)
        subs[here].wait_payload(f"last {here}".encode())
    own = [m.payload for s in subs.values() for m in s.messages if m.payload.startswith(b"own")]
    assert not own, f"No Local subscribers got their own messages: {own}"
    text = broker.log_text()
    assert "unanswered" not in text, "a SUBACK went out before the other router acknowledged the interest"
    assert "Traceback" not in text
