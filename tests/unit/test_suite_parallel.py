"""What keeps the suite's own parallel run (pytest-xdist, ``-n 2``) safe, and its markers true: the
port ranges of the workers, the turn an ``alone`` test waits for, the markers a test gets."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from tests import conftest, helpers


def test_each_xdist_worker_picks_ports_from_a_range_no_other_worker_uses(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    ranges = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        ranges.append(set(helpers.worker_ports(10_000, 32_767)))
    assert all(len(r) > 7000 for r in ranges)
    assert not (ranges[0] & ranges[1]) and not (ranges[1] & ranges[2]) and not (ranges[0] & ranges[2])
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert helpers.worker_ports(10_000, 32_767) == range(10_000, 32_767)  # a serial run: all of it


def test_a_port_handed_out_is_not_handed_out_again_before_it_is_bound():
    ports = [helpers.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(p in helpers.worker_ports() for p in ports)


def _hold(kind: str, run: str, entered: multiprocessing.Event, spans: multiprocessing.Queue) -> None:
    import os

    os.environ["PYTEST_XDIST_TESTRUNUID"] = run
    with conftest._turn(kind):
        entered.set()
        start = time.monotonic()
        time.sleep(0.3)
        spans.put((kind, start, time.monotonic()))


def _spans(kinds: list[str]) -> list[tuple[str, float, float]]:
    """Each kind's test held in turn, started 0.1 s apart (the first entered before the next)."""
    ctx = multiprocessing.get_context("fork")
    spans = ctx.Queue()
    procs = []
    for i, kind in enumerate(kinds):
        entered = ctx.Event()
        procs.append(ctx.Process(target=_hold, args=(kind, "r", entered, spans)))
        procs[-1].start()
        if i == 0:
            assert entered.wait(10)
        else:
            time.sleep(0.1)
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    return sorted(spans.get(timeout=1) for _ in procs)


def _overlap(a: tuple[str, float, float], b: tuple[str, float, float]) -> bool:
    return a[1] < b[2] and b[1] < a[2]


def test_an_alone_test_runs_with_no_other_test_beside_it(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest.tempfile, "gettempdir", lambda: str(tmp_path))
    # a plain test first; the alone one waits for it; a plain and a companion wait behind the alone one
    got = _spans(["plain", "alone", "plain", "companion"])
    alone = next(s for s in got if s[0] == "alone")
    assert not any(_overlap(alone, s) for s in got if s is not alone), got


def _after_alone(run: str, total: int, entered: multiprocessing.Event) -> None:
    import os

    os.environ["PYTEST_XDIST_TESTRUNUID"] = run
    with conftest._turn("companion", after_alone=True, alone_total=total):
        entered.set()


def test_the_other_units_tests_wait_until_every_alone_test_is_done(tmp_path, monkeypatch):
    """A test whose unit has no ``alone`` test starts once the run's ``alone`` tests are all done,
    each one's file written (a companion beside no running test waited for 37 s in a CI run)."""
    monkeypatch.setattr(conftest.tempfile, "gettempdir", lambda: str(tmp_path))
    done = conftest._alone_done("r")
    done.mkdir(parents=True)
    (done / "first").touch()
    ctx = multiprocessing.get_context("fork")
    entered = ctx.Event()
    proc = ctx.Process(target=_after_alone, args=("r", 2, entered))
    proc.start()
    try:
        assert not entered.wait(0.5), "started with one alone test of two done"
        (done / "second").touch()
        assert entered.wait(10), "not started once both were done"
    finally:
        proc.join(10)
    assert proc.exitcode == 0


def test_a_wait_for_alone_tests_that_never_end_is_bounded(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(conftest.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(conftest, "ALONE_WAIT_S", 0.3)
    start = time.monotonic()
    conftest._wait_for_alone("r", 1)
    assert 0.3 <= time.monotonic() - start < 5
    assert "1 alone tests not all done" in capsys.readouterr().out


def test_a_loud_test_runs_beside_companions_only(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest.tempfile, "gettempdir", lambda: str(tmp_path))
    # the loud one first; a plain test waits for it, a companion runs beside it
    got = _spans(["loud", "plain", "companion"])
    loud, plain, companion = (next(s for s in got if s[0] == k) for k in ("loud", "plain", "companion"))
    assert _overlap(loud, companion), got
    assert not _overlap(loud, plain), got


def test_a_test_is_marked_by_its_directory_and_by_the_lists():
    assert conftest._marks("tests/unit/test_codec.py::test_x") == ["unit"]
    assert conftest._marks("tests/chaos/test_chaos.py::test_chaos_three_nodes") == ["chaos", "slow", "loud"]
    assert conftest._marks("tests/integration/test_bench.py::test_x") == ["integration", "slow"]
    name = "tests/integration/test_bench.py::test_fleet_delivers_each_devices_message_to_both_backend_subscribers"
    assert conftest._marks(name) == ["integration", "slow", "alone"]
    assert conftest._marks("tests/partition/test_patterns.py::test_x") == ["slow", "alone"]
    name = "tests/cluster/test_replication.py::test_a_persistent_session_survives_its_nodes_death[b-c]"
    assert conftest._marks(name) == ["cluster", "slow"]
    assert conftest._marks("tests/partition/test_readers.py::test_x") == []


class _Item:
    """What ordering reads of a pytest item: its id and its markers."""

    def __init__(self, nodeid: str, *marks: pytest.MarkDecorator) -> None:
        self.nodeid = nodeid
        self.marks = {m.mark.name: m.mark for m in marks}

    def get_closest_marker(self, name: str):
        return self.marks.get(name)


def test_a_parallel_run_starts_the_longest_work_units_first_and_keeps_a_groups_tests_together():
    spark = pytest.mark.xdist_group("spark")
    items = [_Item("a::short"), _Item("b::s1", spark), _Item("c::long"), _Item("b::s2", spark),
             _Item("d::never_run", pytest.mark.slow), _Item("e::never_run"), _Item("a::short2")]
    durations = {"a::short": 0.5, "b::s1": 3.0, "b::s2": 3.0, "c::long": 5.0, "a::short2": 0.5}
    order = [i.nodeid for i in conftest._longest_first(items, durations)]
    # a slow test never run is guessed long; the group's 6 s beat the single 5 s; ties keep their order
    assert order == ["d::never_run", "b::s1", "b::s2", "c::long", "e::never_run", "a::short", "a::short2"]
    items.append(_Item("f::timed", pytest.mark.alone))
    order = [i.nodeid for i in conftest._longest_first(items, {**durations, "f::timed": 1.0})]
    assert order[0] == "f::timed"  # before all: later it would wait for what runs beside it


def test_each_loud_test_is_followed_by_its_share_of_the_companions():
    unit, pipeline, loud = pytest.mark.unit, pytest.mark.pipeline, pytest.mark.loud
    items = [_Item("p::plain"), _Item("u::a", unit), _Item("c::l1", loud), _Item("u::b", unit),
             _Item("s::j", pipeline), _Item("c::l2", loud), _Item("t::alone", pytest.mark.alone)]
    durations = {"p::plain": 9.0, "u::a": 0.1, "c::l1": 50.0, "u::b": 0.2, "s::j": 20.0, "c::l2": 25.0,
                 "t::alone": 1.0}
    order = [i.nodeid for i in conftest._longest_first(items, durations)]
    # alone first; then each loud one with companions dealt round, the longest to the first; then the rest
    assert order == ["t::alone", "c::l1", "s::j", "u::a", "c::l2", "u::b", "p::plain"]
    assert [conftest._kind(i) for i in items] == ["plain", "companion", "loud", "companion", "companion",
                                                   "loud", "alone"]


def test_a_tests_seconds_are_kept_under_its_own_id_whatever_group_xdist_appended():
    assert conftest._test_id("tests/pipeline/test_jobs.py::test_x@spark") == "tests/pipeline/test_jobs.py::test_x"
    assert conftest._test_id("tests/unit/t.py::test_y[a@b]") == "tests/unit/t.py::test_y[a@b]"
    assert conftest._test_id("tests/unit/t.py::test_y[a@b]@g") == "tests/unit/t.py::test_y[a@b]"


def test_the_seconds_of_a_run_are_merged_into_those_of_the_runs_before():
    class Cache(dict):
        def set(self, key, value):
            self[key] = value

    class Report:
        def __init__(self, nodeid: str, duration: float, skipped: bool = False) -> None:
            self.nodeid, self.duration, self.skipped = nodeid, duration, skipped

    config = type("Config", (), {"cache": Cache({conftest.DURATIONS_KEY: {"old::t": 9.0, "t::a": 1.0}})})()
    durations = conftest._Durations(config)
    for phase in (0.25, 2.0, 0.25):  # setup, call, teardown
        durations.pytest_runtest_logreport(Report("t::a@g", phase))
    durations.pytest_runtest_logreport(Report("t::skipped", 0.1, skipped=True))
    durations.pytest_sessionfinish()
    assert config.cache[conftest.DURATIONS_KEY] == {"old::t": 9.0, "t::a": 2.5}


def test_under_loadgroup_a_grouped_tests_id_ends_in_its_group_and_another_keeps_its_own():
    """What xdist's controller makes work units of: pytest 9 keeps the id in ``_id``, where the
    worker's own appending (to ``_nodeid``) no longer lands."""
    NodeId = pytest.importorskip("_pytest.nodeid").NodeId  # noqa: N806

    class Item:
        def __init__(self, name: str, *marks: pytest.MarkDecorator) -> None:
            self._id = NodeId.parse(name)
            self.marks = {m.mark.name: m.mark for m in marks}

        nodeid = property(lambda self: str(self._id))
        get_closest_marker = _Item.get_closest_marker

    items = [Item("tests/p.py::test_a[x]", pytest.mark.xdist_group("spark")), Item("tests/p.py::test_b")]
    conftest._name_units(items)
    assert [i.nodeid for i in items] == ["tests/p.py::test_a[x]@spark", "tests/p.py::test_b"]
    assert conftest._test_id(items[0].nodeid) == "tests/p.py::test_a[x]"


def test_a_fresh_clone_orders_by_the_committed_durations():
    """CI's first run has no cache: it orders by tests/durations.json (the longest start first)."""
    committed = conftest._committed_durations()
    assert committed["tests/chaos/test_chaos.py::test_chaos_three_nodes"] > 10
    assert all(seconds >= 1.0 for seconds in committed.values())
