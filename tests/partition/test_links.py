"""The mesh's links come back soon after a cut heals (issue 41; partition seed 315: node a's link
was down 2.6 s and its mesh links came back 17 to 23 s after the heal).

Node a's link is set down, with traffic on the mesh; once it is up again, a publisher and a
subscriber connect to a (fresh connections, so that no client connection's own retransmissions
count), and messages published on a must reach a subscriber on b, and those published on b a
subscriber on a, within ``BACK_S`` of the heal. A mesh link whose TCP connection lost packets
otherwise waits for TCP's retransmission back-off (the sender's timer doubles at each loss).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import pytest

from tests.helpers import Broker, Client
from tests.partition.netns import Lab
from tests.partition.scenario import NsNode, start_nodes

# (fault, seconds): a's link down as long as seed 315's; a cut off by the others' firewalls (their
# packets dropped on arrival, no error anywhere) past several doublings of TCP's retransmission timer.
FAULTS = [("link-down", 2.6), ("isolate", 15.0)]
BACK_S = 2.5  # from the heal until the mesh carries a's and b's messages both ways again
TRAFFIC_S = 0.05  # b's publisher: a message this often, before, during and after the cut

pytestmark = pytest.mark.partition


class Ticker:
    """A publisher on one node: a numbered QoS 0 message on ``topic`` every ``TRAFFIC_S``."""

    def __init__(self, node: NsNode, topic: str) -> None:
        self.client = Client(node.port, f"tick-{uuid.uuid4().hex[:6]}", host=node.host, keepalive=60).connect()
        self.topic = topic
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.stop.wait(TRAFFIC_S):
            n += 1
            self.client.c.publish(self.topic, str(n).encode(), 0)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.client.drop()


def first_after(client: Client, topic: str, deadline: float) -> float | None:
    """When ``client`` first got a message on ``topic`` (monotonic), waiting until ``deadline``."""
    with client.cond:
        client.cond.wait_for(lambda: any(m.topic == topic for m in client.messages),
                             max(0.0, deadline - time.monotonic()))
    return time.monotonic() if any(m.topic == topic for m in client.messages) else None


def cut(fault: str, a: NsNode, others: list[NsNode]) -> Callable[[], None]:
    """Make ``fault`` on node ``a``; returns what heals it."""
    if fault == "link-down":
        a.net.link(False)
        return lambda: a.net.link(True)
    a.net.drop_from([n.host for n in others])
    for n in others:
        n.net.drop_from([a.host])

    def heal() -> None:
        for n in (a, *others):
            n.net.heal()
    return heal


@pytest.mark.parametrize(("fault", "cut_s"), FAULTS)
def test_mesh_links_back_soon_after_a_cut(lab: Lab, start_broker: Callable[..., Broker], fault: str,
                                          cut_s: float) -> None:
    a, b, c = start_nodes(start_broker, lab, ["--allow-anonymous", "on"], None, workers=1)
    on_b = Client(b.port, f"sub-b-{uuid.uuid4().hex[:6]}", host=b.host, keepalive=60).connect()
    on_b.subscribe("links/#", 0)
    from_b = Ticker(b, "links/from-b")  # b's frames to a meet the cut: its TCP connection backs off
    try:
        time.sleep(1.0)
        heal = cut(fault, a, [b, c])
        time.sleep(cut_s)
        heal()
        healed = time.monotonic()
        deadline = healed + BACK_S
        on_a = Client(a.port, f"sub-a-{uuid.uuid4().hex[:6]}", host=a.host, keepalive=60).connect()
        on_a.subscribe("links/from-b", 0)
        from_a = Ticker(a, "links/from-a")
        try:
            a_to_b = first_after(on_b, "links/from-a", deadline)
            b_to_a = first_after(on_a, "links/from-b", deadline)
        finally:
            from_a.close()
        print(f"{fault} {cut_s} s: a -> b back after "
              f"{'-' if a_to_b is None else f'{a_to_b - healed:.2f} s'}, b -> a after "
              f"{'-' if b_to_a is None else f'{b_to_a - healed:.2f} s'}")
        late = [f"{what} not within {BACK_S} s of the heal" for what, at in
                (("a -> b", a_to_b), ("b -> a", b_to_a)) if at is None]
        assert not late, f"after {fault} of a for {cut_s} s: {'; '.join(late)}"
    finally:
        from_b.close()
