"""What retained messages and subscriptions cost a worker: the limits charge what is held, and one
client's big SUBSCRIBE (many filters, or a '#' over many retained messages) holds nobody else up."""

from __future__ import annotations

import threading
import time

from brokerd.connection.codec import encode
from brokerd.connection.packets import Pingreq, Pingresp, Puback, Publish, Suback, Subscribe, Subscription
from brokerd.router.limits import retained_size
from brokerd.router.message import Message
from tests.helpers import Client, cid, wait_for
from tests.integration.test_limits import STATS, _raw_connect, _read, _until_limit

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


class _Probe:
    """Another client of the same worker: PINGREQ round trips, one after another, until closed.
    A raw socket in a thread of its own, blocked in recv (no GIL held) while it waits."""

    def __init__(self, port: int) -> None:
        self.raw, self.decoder = _raw_connect(port, 4, "probe")
        self.worst = 0.0
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        ping = encode(Pingreq(), 4)
        while not self._stop.is_set():
            start = time.monotonic()
            self.raw.send(ping)
            [pong] = _read(self.raw, self.decoder, 1)  # bounded by the socket's timeout
            assert type(pong) is Pingresp
            self.worst = max(self.worst, time.monotonic() - start)
            self.count += 1
            time.sleep(0.002)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive()


def test_one_subscribe_of_150000_invalid_filters_floods_no_log_and_holds_nobody_up(start_broker):
    """Each refused filter was an INFO line: 150,000 lines (16 MiB) for one 900 KB SUBSCRIBE, and
    the worker's other clients waited 2.1 s. The lines are rate-limited now (with one summary).
    One worker: the stall asserted is the worker's."""
    broker = start_broker("--max-packet-size", "2M", workers=1)
    probe = _Probe(broker.port)
    raw, decoder = _raw_connect(broker.port, 4, "flood")
    time.sleep(0.2)
    lines = broker.log_text(this_run=True).count("\n")
    n = 150_000
    raw.send(encode(Subscribe(1, [Subscription("a+b", 0)] * n), 4))  # '+' within a level: invalid
    [suback] = _read(raw, decoder, 1)
    time.sleep(0.3)
    probe.close()
    assert type(suback) is Suback and suback.reason_codes == [0x80] * n
    wait_for(lambda: "more refused topic filter lines suppressed" in broker.log_text(), what="the summary line")
    grown = broker.log_text(this_run=True).count("\n") - lines
    assert grown < 200, f"{grown} log lines for one SUBSCRIBE"
    assert probe.count >= 3 and probe.worst < 0.5, (probe.count, probe.worst)


def test_a_subscribe_to_100000_retained_messages_sends_them_all_and_holds_nobody_up(start_broker):
    """'#' over 50,000 retained messages took the worker for one turn (108 ms, ~2 s at the old
    default limit); they go out a slice per loop turn now, all of them, once each, while another
    client's round trips stay short (100,000 here: the old stall, ~220 ms, well beyond the bound;
    ~30 ms now, a garbage collection's pause among them). One worker: the stall asserted is the
    worker's."""
    broker = start_broker("--max-client-buffer", "16M", workers=1)
    n = 100_000
    filler, fdec = _raw_connect(broker.port, 4, "filler")
    packets = [encode(Publish(f"r/{i}", b"v", 0, retain=True), 4) for i in range(n)]
    filler.send(b"".join(packets) + encode(Publish("r/end", b"v", 1, retain=True, packet_id=1), 4))
    [puback] = _read(filler, fdec, 1)  # the broker handles a client's packets in order: all are set
    assert type(puback) is Puback
    probe = _Probe(broker.port)
    sub, sdec = _raw_connect(broker.port, 4, "everything")
    expected = sum(len(p) for p in packets) + len(encode(Publish("r/end", b"v", 0, retain=True), 4))
    sub.send(encode(Subscribe(1, [Subscription("#", 0)]), 4))
    got = bytearray()
    deadline = time.monotonic() + 60
    while len(got) < expected + 5 and time.monotonic() < deadline:  # 5: the SUBACK
        data = sub.sock.recv(1 << 20)
        assert data, "connection closed"
        got += data
    time.sleep(0.2)
    probe.close()
    received = sdec.feed(bytes(got))
    assert type(received[0]) is Suback
    topics = [p.topic for p in received[1:]]  # type: ignore[attr-defined]
    assert len(topics) == n + 1 and set(topics) == {f"r/{i}" for i in range(n)} | {"r/end"}
    assert probe.count >= 3 and probe.worst < 0.1, (probe.count, probe.worst)
