"""``EndOfTick``'s rules with a fake loop: which items a mid-iteration ``flush_since`` reaches,
the order of the end-of-iteration pass, an item that waits for the next iteration's end, and one
``call_soon`` per iteration for all of them. Values only: no sockets, no event loop."""

from __future__ import annotations

import pytest

from brokerd.connection.batching import EndOfTick
from brokerd.router.clock import FakeClock


class _Item:
    """A Flushable that records, in a journal shared by all items, each flush that wrote something."""

    def __init__(self, name: str, journal: list[tuple[str, list[int]]]) -> None:
        self.name = name
        self.journal = journal
        self.out: list[int] = []

    def flush(self) -> None:
        if self.out:
            self.journal.append((self.name, self.out))
            self.out = []


def _setup() -> tuple[FakeClock, EndOfTick, list[tuple[str, list[int]]]]:
    clock = FakeClock()
    return clock, EndOfTick(clock), []


def test_an_end_only_item_is_not_written_early_by_flush_since_but_at_the_iterations_end():
    clock, tick, journal = _setup()
    conn, mesh = _Item("conn", journal), _Item("mesh", journal)
    mark = tick.pending()
    conn.out.append(1)
    tick.mark(conn)
    mesh.out.append(1)
    tick.mark_end(mesh)
    assert tick.pending() == mark + 1  # the end-only item is no part of the marks
    tick.flush_since(mark)
    assert journal == [("conn", [1])]  # the quiet client's write went at once; the mesh's batch waits
    mesh.out.append(2)  # and keeps filling
    clock.run_ready()
    assert journal == [("conn", [1]), ("mesh", [1, 2])]


def test_end_only_items_flush_first_then_the_others_in_the_order_marked():
    clock, tick, journal = _setup()
    a, log, mesh = _Item("a", journal), _Item("log", journal), _Item("mesh", journal)
    for item in (a, log):
        item.out.append(1)
        tick.mark(item)
    mesh.out.append(1)
    tick.mark_end(mesh)  # marked last, flushed first
    clock.run_ready()
    assert [name for name, _ in journal] == ["mesh", "a", "log"]


def test_what_a_flush_marks_is_flushed_in_the_same_pass_end_only_items_too():
    clock, tick, journal = _setup()
    mesh, conn = _Item("mesh", journal), _Item("conn", journal)

    class _Log(_Item):
        def flush(self) -> None:  # the log's write opens a gate: the connection writes; a frame follows
            super().flush()
            conn.out.append(7)
            tick.mark(conn)
            mesh.out.append(7)
            tick.mark_end(mesh)

    log = _Log("log", journal)
    log.out.append(1)
    tick.mark(log)
    assert clock.run_ready() == 1
    assert journal == [("log", [1]), ("conn", [7]), ("mesh", [7])]
    assert clock.pending == 0  # nothing left for another iteration


def test_an_item_that_waits_once_more_is_flushed_at_the_next_iterations_end_with_what_came_meanwhile():
    clock, tick, journal = _setup()
    conn = _Item("conn", journal)

    class _Lingering(_Item):
        """Waits for the next iteration's end once, as the mesh's small batches do."""

        lingered = False

        def flush(self) -> None:
            if not self.lingered:
                self.lingered = True
                tick.mark_next(self)
                return
            self.lingered = False
            super().flush()

    mesh = _Lingering("mesh", journal)
    mesh.out.append(1)
    tick.mark_end(mesh)
    conn.out.append(1)
    tick.mark(conn)
    clock.run_ready()  # this iteration's end: the connection writes, the mesh waits
    assert journal == [("conn", [1])]
    assert clock.pending == 1
    mesh.out.append(2)  # the next iteration's reads
    conn.out.append(2)
    tick.mark(conn)
    assert clock.pending == 1  # the pass the mesh waits for is that iteration's, for everything
    clock.run_ready()
    assert journal == [("conn", [1]), ("mesh", [1, 2]), ("conn", [2])]
    assert clock.pending == 0


def test_one_call_soon_an_iteration_for_every_kind_of_mark():
    clock, tick, journal = _setup()
    items = [_Item(str(i), journal) for i in range(6)]
    for i, item in enumerate(items):
        item.out.append(i)
        (tick.mark if i % 2 else tick.mark_end)(item)
    assert clock.pending == 1
    assert clock.run_ready() == 1
    assert sorted(name for name, _ in journal) == [str(i) for i in range(6)]
    assert clock.pending == 0
    items[0].out.append(9)
    tick.mark(items[0])  # a new iteration schedules its own pass
    assert clock.pending == 1


def test_flush_since_writes_early_at_most_a_few_times_an_iteration_and_again_after_its_end():
    clock, tick, journal = _setup()
    quiet = [_Item(f"q{i}", journal) for i in range(EndOfTick.EARLY_PER_TURN + 1)]
    for i, item in enumerate(quiet):
        mark = tick.pending()
        item.out.append(i)
        tick.mark(item)
        tick.flush_since(mark)
    assert [name for name, _ in journal] == [f"q{i}" for i in range(EndOfTick.EARLY_PER_TURN)]
    clock.run_ready()
    assert journal[-1] == (f"q{EndOfTick.EARLY_PER_TURN}", [EndOfTick.EARLY_PER_TURN])
    mark = tick.pending()
    quiet[0].out.append(99)
    tick.mark(quiet[0])
    tick.flush_since(mark)  # a new iteration: early writes allowed again
    assert journal[-1] == ("q0", [99])


def test_an_end_only_item_that_fails_leaves_the_others_and_later_iterations_flushing():
    """The mesh's frames are an item of the same pass as every connection's write: its failure
    (raised to the loop's exception handler) must not stop them, now or in later iterations."""
    clock, tick, journal = _setup()

    class _Failing(_Item):
        def flush(self) -> None:
            self.out = []
            raise RuntimeError("a frame that cannot be packed")

    mesh, conn = _Failing("mesh", journal), _Item("conn", journal)
    mesh.out.append(1)
    tick.mark_end(mesh)
    conn.out.append(1)
    tick.mark(conn)
    with pytest.raises(RuntimeError):
        clock.run_ready()
    assert journal == [("conn", [1])]
    conn.out.append(2)
    tick.mark(conn)
    assert clock.pending == 1  # the next iteration has its pass
    clock.run_ready()
    assert journal == [("conn", [1]), ("conn", [2])]
