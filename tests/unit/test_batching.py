"""The per-iteration turn budget that all of a worker's connections share."""

from __future__ import annotations

import asyncio

from brokerd.connection.batching import EndOfTick, TurnBudget
from brokerd.connection.codec import encode
from brokerd.connection.packets import Connect, Publish
from brokerd.connection.protocol import MQTTConnection


def test_shares_shrink_within_a_turn_and_start_over_in_the_next():
    async def run() -> list[list[int]]:
        turn = TurnBudget(asyncio.get_running_loop(), 40)
        turns = []
        for _ in range(2):
            shares = []
            for _ in range(5):  # five busy connections, each wanting 16
                n = turn.share(16)
                turn.left -= n
                shares.append(n)
            turns.append(shares)
            await asyncio.sleep(0)  # the next loop iteration
        return turns

    first, second = asyncio.run(run())
    assert first == [16, 16, 8, 4, 4]  # 40 in all, then the minimum so that nobody starves
    assert second == first  # the count started over


def test_a_quiet_turn_gives_every_connection_its_cap():
    async def run() -> list[int]:
        turn = TurnBudget(asyncio.get_running_loop(), 64)
        return [turn.share(16) for _ in range(3)]  # nothing taken yet: each may take its cap

    assert asyncio.run(run()) == [16, 16, 16]


class _Transport(asyncio.Transport):
    """The socket side only: the connection under test pauses and resumes it and writes to it."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def write(self, data: bytes) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0  # the kernel took every write

    def is_closing(self) -> bool:
        return False


class _Fanning:
    """A handler whose every PUBLISH reaches ``fan`` subscribers (it counts the deliveries)."""

    def __init__(self, fan: int) -> None:
        self.fan = fan
        self.delivered = 0
        self.publishes = 0

    def packet_received(self, packet: object) -> None:
        if type(packet) is Publish:
            self.publishes += 1
            self.delivered += self.fan

    def connection_lost(self, graceful: bool) -> None:
        pass


def _publishes_per_turn(fan: int, payload: int, fan_budget: int, turns: int = 6) -> list[int]:
    """Feed CONNECT and 200 PUBLISHes in one read; how many PUBLISHes each loop iteration handled."""
    async def run() -> list[int]:
        loop = asyncio.get_running_loop()
        handler = _Fanning(fan)
        turn = TurnBudget(loop, 1000, fan_budget, lambda: handler.delivered)
        conn = MQTTConnection(lambda c: handler, EndOfTick(loop), max_packet_size=1 << 20, read_budget=16,
                              turn=turn)  # type: ignore[arg-type,return-value]
        conn.connection_made(_Transport())
        data = encode(Connect("fan"), 4) + encode(Publish("f/t", b"x" * payload), 4) * 200
        conn.data_received(data)
        counts = [handler.publishes]
        for _ in range(turns - 1):
            await asyncio.sleep(0)  # the next loop iteration: the next share of the read
            counts.append(handler.publishes - sum(counts))
        conn.connection_lost(None)
        return counts

    return asyncio.run(run())


def test_a_fan_out_takes_fewer_packets_per_turn():
    # 50 subscribers: at most 512 deliveries per turn is 10 PUBLISHes; at ~2 KiB each delivery
    # counts twice, so 5. Without a fan budget the read budget's 16.
    assert _publishes_per_turn(fan=50, payload=16, fan_budget=512) == [15, 10, 10, 10, 10, 10]
    assert _publishes_per_turn(fan=50, payload=2000, fan_budget=512) == [15, 5, 5, 5, 5, 5]
    assert _publishes_per_turn(fan=50, payload=2000, fan_budget=0) == [15, 16, 16, 16, 16, 16]


def test_unfanned_or_small_fan_outs_keep_the_read_budget():
    # 1 x 1 KiB and 20 x 16 B per PUBLISH stay within 512 deliveries at 16 packets a turn.
    assert _publishes_per_turn(fan=1, payload=1000, fan_budget=512) == [15, 16, 16, 16, 16, 16]
    assert _publishes_per_turn(fan=20, payload=16, fan_budget=512) == [15, 16, 16, 16, 16, 16]
    # One packet a turn at least, however wide the fan-out.
    assert _publishes_per_turn(fan=5000, payload=16, fan_budget=512) == [15, 1, 1, 1, 1, 1]


class _Out:
    """A Flushable that counts its flushes and the items it wrote."""

    def __init__(self, batcher: EndOfTick) -> None:
        self.batcher = batcher
        self.out: list[int] = []
        self.written: list[list[int]] = []

    def send(self, item: int) -> None:
        if not self.out:
            self.batcher.mark(self)
        self.out.append(item)

    def flush(self) -> None:
        if self.out:
            self.written.append(self.out)
            self.out = []


def test_what_a_quiet_packet_causes_is_written_at_once_a_few_times_a_turn():
    async def run() -> tuple[list, list, list]:
        batcher = EndOfTick(asyncio.get_running_loop())
        busy, quiet = _Out(batcher), [_Out(batcher) for _ in range(EndOfTick.EARLY_PER_TURN + 1)]
        busy.send(1)  # a busy client's output, dirty before the quiet packets come
        for i, out in enumerate(quiet):
            mark = batcher.pending()
            out.send(10 + i)
            busy.send(2 + i)  # the quiet packet also reached the busy subscriber: not early
            batcher.flush_since(mark)
        early = [list(o.written) for o in quiet]
        busy_early = list(busy.written)
        await asyncio.sleep(0)  # the end of the iteration writes the rest
        mark = batcher.pending()
        quiet[-1].send(99)
        batcher.flush_since(mark)  # a new iteration: early writes allowed again
        return early, busy_early, [busy.written, quiet[-1].written]

    early, busy_early, after = asyncio.run(run())
    n = EndOfTick.EARLY_PER_TURN
    assert early == [[[10 + i]] for i in range(n)] + [[]]  # the first n at once, the last waits
    assert busy_early == []  # it was dirty already: it keeps its place in the iteration's batch
    assert after == [[[1, 2, 3, 4, 5, 6]], [[10 + n], [99]]]


class _Forward:
    """A handler that sends every PUBLISH's payload to another connection."""

    def __init__(self, to: MQTTConnection) -> None:
        self.to = to

    def packet_received(self, packet: object) -> None:
        if type(packet) is Publish:
            self.to.send(packet.payload)

    def connection_lost(self, graceful: bool) -> None:
        pass


class _Recording(_Transport):
    def __init__(self) -> None:
        super().__init__()
        self.data: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.data.append(data)


def test_a_read_of_one_packet_is_delivered_before_the_iteration_ends_a_pipelined_one_after():
    async def run() -> tuple[list, list, list]:
        loop = asyncio.get_running_loop()
        batcher = EndOfTick(loop)
        sub = MQTTConnection(lambda c: _Forward(c), batcher, max_packet_size=1 << 20)  # type: ignore[arg-type,return-value]
        sub_t = _Recording()
        sub.connection_made(sub_t)
        pub = MQTTConnection(lambda c: _Forward(sub), batcher, max_packet_size=1 << 20)  # type: ignore[arg-type,return-value]
        pub.connection_made(_Recording())
        pub.data_received(encode(Connect("p"), 4))
        await asyncio.sleep(0)
        pub.data_received(encode(Publish("t", b"one"), 4))  # quiet: written at once
        at_once = list(sub_t.data)
        pub.data_received(encode(Publish("t", b"two"), 4) + encode(Publish("t", b"three"), 4))
        pipelined = list(sub_t.data)
        await asyncio.sleep(0)
        return at_once, pipelined, list(sub_t.data)

    at_once, pipelined, end = asyncio.run(run())
    assert at_once == [b"one"] and pipelined == [b"one"] and end == [b"one", b"twothree"]
