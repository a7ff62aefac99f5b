"""Fixtures shared by every test directory: real brokerd processes on free loopback ports; the
markers each test gets from where it lives; what makes a parallel run (pytest-xdist, which
./scripts/test runs by default) safe, its groups whole and its longest tests first."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT, Broker, Client, free_port, stop_together

# Every process a test starts (brokerd, its CLI, Spark's Python workers) imports this checkout's
# packages, not those of whichever checkout a shared virtualenv's editable install points at
# (scripts/lib/pythonpath/README.md; pytest's ``pythonpath`` does the same for this process);
# the root, for ``tests.*``.
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [str(ROOT / "scripts" / "lib" / "pythonpath"), str(ROOT), os.environ.get("PYTHONPATH")]))

_names = itertools.count()
LOG_TAIL_LINES = 80  # of each broker's log, printed under a failed test's report

# The marker of each test directory (``-m unit``: the fast loop; ``-m "not slow"``: all but the
# longest). tests/partition has its own, ``partition``.
DIRECTORY_MARKERS = {"unit", "integration", "cluster", "chaos", "deploy", "pipeline"}

# ``slow``: over 5 s each on a two-core box (``--durations=0`` of whole runs, serial and ``-n 2``).
# Whole files where most tests are; otherwise the tests by name (parameters aside).
SLOW_FILES = {
    "tests/chaos/test_chaos.py",
    "tests/partition/test_patterns.py",
    "tests/partition/test_partition.py",
    "tests/integration/test_bench.py",
    "tests/pipeline/test_broker.py",
    "tests/pipeline/test_jobs.py",
}
SLOW_TESTS = {
    "tests/cluster/test_faults.py::test_a_connect_waits_for_a_stopped_worker_of_its_node_bounded",
    "tests/cluster/test_faults.py::test_a_restarted_node_gets_what_it_never_confirmed_before_its_crash",
    "tests/cluster/test_faults.py::"
    "test_a_session_moved_while_a_router_was_silent_asks_it_for_what_it_published_meanwhile",
    "tests/cluster/test_faults.py::"
    "test_what_a_sessions_old_router_had_not_handed_on_when_it_fell_silent_is_read_back",
    "tests/cluster/test_multihost.py::"
    "test_pub_on_one_node_reaches_subscribers_on_others_and_survives_a_node_restart",
    "tests/cluster/test_operator_lines.py::"
    "test_a_node_whose_peers_died_says_they_are_silent_and_no_contradicting_warning",
    "tests/cluster/test_operator_lines.py::test_a_node_with_another_mesh_key_says_which_peer_it_cannot_join",
    "tests/cluster/test_replication.py::"
    "test_a_dead_follower_is_replaced_and_publishes_go_on_being_acknowledged",
    "tests/cluster/test_replication.py::"
    "test_a_dead_nodes_connected_client_has_its_will_published_by_the_holder_of_its_session",
    "tests/cluster/test_replication.py::"
    "test_a_dead_nodes_delayed_will_goes_out_from_the_holder_of_its_sessions",
    "tests/cluster/test_replication.py::test_a_dead_nodes_session_brings_its_whole_backlog_beyond_max_queued",
    "tests/cluster/test_replication.py::"
    "test_a_follower_placed_at_the_high_water_mark_fetches_what_lies_below",
    "tests/cluster/test_replication.py::"
    "test_a_follower_restarted_while_the_sessions_router_is_dead_still_serves_them",
    "tests/cluster/test_replication.py::test_a_history_fetch_broken_off_by_a_crash_goes_on_from_what_it_had",
    "tests/cluster/test_replication.py::"
    "test_a_moved_sessions_spool_is_read_back_from_its_origin_when_its_new_node_dies",
    "tests/cluster/test_replication.py::"
    "test_a_node_back_on_an_empty_disk_continues_its_log_and_catches_up_as_a_follower",
    "tests/cluster/test_replication.py::"
    "test_a_node_the_others_cannot_hear_serves_no_session_though_it_hears_them",
    "tests/cluster/test_replication.py::"
    "test_a_node_whose_loop_stopped_beyond_the_mesh_timeout_serves_no_session_when_it_runs_again",
    "tests/cluster/test_replication.py::"
    "test_a_partition_that_cuts_only_some_links_gives_no_session_two_owners",
    "tests/cluster/test_replication.py::"
    "test_a_partitioned_minority_stops_acknowledging_and_nothing_acknowledged_is_lost",
    "tests/cluster/test_replication.py::test_a_persistent_session_survives_its_nodes_death",
    "tests/cluster/test_replication_gap.py::"
    "test_a_follower_back_from_a_cut_fetches_what_it_missed_without_new_writes",
    "tests/cluster/test_replication.py::"
    "test_a_restarted_router_does_not_wipe_the_sessions_its_follower_holds",
    "tests/cluster/test_replication.py::"
    "test_a_session_that_moves_during_a_partition_gets_what_the_cut_off_side_published",
    "tests/cluster/test_replication.py::"
    "test_a_third_node_joining_a_node_whose_only_peer_died_does_not_cut_it_off",
    "tests/cluster/test_replication.py::"
    "test_a_will_dropped_by_disconnect_is_not_published_when_the_node_dies_right_after",
    "tests/cluster/test_replication.py::"
    "test_acknowledged_means_on_two_nodes_and_a_dead_publishers_node_loses_nothing",
    "tests/cluster/test_replication.py::"
    "test_the_holder_of_a_replica_keeps_a_session_until_its_new_owner_confirms",
    "tests/cluster/test_session_owner.py::"
    "test_a_dead_nodes_session_is_not_handed_from_its_replica_to_another_user",
    "tests/deploy/test_prometheus.py::test_prometheus_scrapes_brokerd_and_counts_what_was_sent",
    "tests/integration/test_auth_seams.py::test_a_plugin_client_waits_without_holding_up_the_loop",
    "tests/integration/test_auth_seams.py::test_slow_http_answers_are_bounded_and_delay_no_one_else",
    "tests/integration/test_backpressure.py::"
    "test_a_client_that_sends_pingreqs_and_never_reads_costs_at_most_its_output_buffer",
    "tests/integration/test_cli.py::test_mesh_joins_are_one_line_per_node",
    "tests/integration/test_listeners.py::"
    "test_silent_sockets_on_tls_and_websocket_listeners_count_and_are_closed_after_10_s",
    "tests/integration/test_stats.py::test_stats_cluster_view_from_one_node",
    "tests/pipeline/test_docs_snippets.py::test_the_snippets_run_as_typed_outside_the_checkout",
    "tests/pipeline/test_stream.py::"
    "test_restart_from_checkpoint_while_traffic_continues_reads_every_record_once",
}

# ``alone``: tests that measure time, memory or throughput, which a test beside them on the other
# core would skew. Under xdist they run with no other test at once (``_turn``); serially, as all do.
ALONE_FILES = {
    # Faults timed against a 1 s mesh timeout on three nodes in namespaces: beside other tests, a
    # node's routers once took over 15 s to see its start through (CI at 0e66e87, pattern E).
    "tests/partition/test_patterns.py",
    "tests/partition/test_partition.py",
}
# And tests by name (parameters aside), where the rest of their file measures nothing.
ALONE_TESTS = {
    # The fleet's rate against what was offered, over half a second (200-800 of 500 msg/s). The
    # file's other runs wait 5 s of quiet before they count a message lost: no neighbour skews them.
    "tests/integration/test_bench.py::test_fleet_delivers_each_devices_message_to_both_backend_subscribers",
    # A node's sessions served within 5-6 s of its link's return (0.2-4.5 s measured alone); beside
    # the suite's other tests on CI's two cores it took 6.1 s once. Its bound is what it tests.
    "tests/partition/test_links.py::test_sessions_served_soon_after_a_link_down",
    # One client's big SUBSCRIBE holds nobody else up: the worker's loop runs at most 150-400 ms
    # of CPU during another client's round trip (its thread's time, which a neighbour's load
    # inflates less than the wall's). The file's other tests count what is charged and delivered.
    "tests/integration/test_retained_cost.py::"
    "test_one_subscribe_of_150000_invalid_filters_floods_no_log_and_holds_nobody_up",
    "tests/integration/test_retained_cost.py::"
    "test_a_subscribe_to_100000_retained_messages_sends_them_all_and_holds_nobody_up",
    "tests/integration/test_retained_cost.py::"
    "test_one_subscribe_of_100000_filters_is_taken_in_slices_and_what_follows_it_waits_its_turn",
}
# ``loud``: tests that load both cores and pass on a loaded machine, beside which the timed waits of
# other tests do not hold. Under xdist only ``companion`` tests run beside them: the chaos suite
# loads both cores for a minute, and the cluster tests' timed waits beside it failed twice (CI
# at 0e66e87 and c01a029); it must pass on a loaded machine, which .ci/run checks on its own,
# beside a CPU hog, and the JVMs and pure computations beside it here are such a load.
LOUD_FILES = {"tests/chaos/test_chaos.py"}
# ``quiet``: in a run of more than tests/unit, the unit tests (no processes, fake clocks) are one
# work unit, first in the order, that takes no turn: one worker runs them from the start, beside
# the ``alone`` tests and then the ``loud`` ones. Before, the ``alone`` tests held three workers
# idle for a minute and a half, and the unit tests then took two minutes of workers beside the
# chaos suite and at the run's end. One worker of unit tests loads one core, where other tests
# beside an ``alone`` one started several processes each.
QUIET_GROUP = "unit"
# Unit tests that time the loop's own thread, beside the alone tests' node starts in that first
# minute: left out of the quiet unit, they run as companions, as before (one read a 128 ms wait
# against its 100 ms bound there, in CI).
TIMED_UNIT_FILES = {"tests/unit/test_replication_writes.py"}
# ``companion``: tests that wait on nothing timed tightly (fake clocks; Spark's generous bounds),
# which run beside a ``loud`` test (a minute of two cores otherwise idle while it ran alone).
COMPANION_DIRECTORIES = {"unit", "pipeline"}
# Not alone: tests/integration/test_backpressure.py. The memory it bounds is its own worker's, which
# no neighbour changes, and its one time (a client beside the flood served within 3 s) is far above
# what a loaded box takes: it passed beside the retained_cost floods, at a load of 5 on two cores.

# The order of a parallel run: the longest work units first (an ``xdist_group``, or one test), so
# that the last to start are short and the workers finish together; ``alone`` ones before all. A test's seconds are its last
# run's (setup, call and teardown, kept in pytest's cache); a test never run is guessed by marker.
DURATIONS_KEY = "brokerd/durations"
# A whole run's seconds per test, kept in the repository (a fresh clone, CI, has no cache): what a
# first run orders by, beneath what the cache holds. Refreshed by hand now and then:
#   ./scripts/test -o cache_dir=/tmp/c && python3 -m tests.conftest /tmp/c
DURATIONS_FILE = Path(__file__).with_name("durations.json")
GUESS_S = {"slow": 15.0, "unit": 0.05}  # the first marker a test has; else GUESS_DEFAULT_S
GUESS_DEFAULT_S = 1.0


def _marks(nodeid: str) -> list[str]:
    """The markers a test gets from where it lives and from the lists above."""
    path, _, name = nodeid.partition("::")
    parts = path.split("/")
    marks = [parts[1]] if len(parts) > 2 and parts[0] == "tests" and parts[1] in DIRECTORY_MARKERS else []
    test = f"{path}::{name.split('[')[0]}"
    if path in SLOW_FILES or test in SLOW_TESTS:
        marks.append("slow")
    if path in ALONE_FILES or test in ALONE_TESTS:
        marks.append("alone")
    if path in LOUD_FILES:
        marks.append("loud")
    return marks


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Markers by directory and by the lists above; under xdist, tests that share something costly
    stay on one worker, so that it is made once (``_shared``), and the longest go first."""
    mixed = any(not item.nodeid.startswith("tests/unit/") for item in items)
    for item in items:
        for mark in _marks(item.nodeid):
            item.add_marker(mark)
        quiet = mixed and item.nodeid.startswith("tests/unit/") and item.nodeid.split("::")[0] not in TIMED_UNIT_FILES
        group = QUIET_GROUP if quiet else _shared(item)
        if group == QUIET_GROUP or (group and item.get_closest_marker("xdist_group") is None):
            item.add_marker(pytest.mark.xdist_group(group))
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and DURATIONS_KEY in workerinput:
        items[:] = _longest_first(items, workerinput[DURATIONS_KEY])
    if workerinput is not None and config.getoption("loadgroup", False):
        _name_units(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The ``alone`` tests that will run (after every deselection), which the tests of the
    other units wait for under xdist (``_wait_for_alone``)."""
    items = session.items
    alone_units = {_group(i) for i in items if _kind(i) == "alone"}
    session.config.stash[ALONE_TOTAL] = sum(1 for i in items if _kind(i) == "alone")
    for item in items:
        item.stash[AFTER_ALONE] = _group(item) not in alone_units and _kind(item) != "quiet"


def _name_units(items: list[pytest.Item]) -> None:
    """Under ``loadgroup`` the controller makes a test's work unit from the ``@group`` at the end
    of its id, which an xdist worker appends to ``item._nodeid``. pytest 9 keeps the id in
    ``item._id`` and no longer reads ``_nodeid``: every group was split over the workers (a Spark
    JVM started on each, a file's shared broker on each). Appended here where that is so."""
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # pytest < 9: xdist's own appending works
        return
    for item in items:
        if isinstance(getattr(item, "_id", None), NodeId) and item.get_closest_marker("xdist_group"):
            item._id = NodeId.parse(f"{item.nodeid}@{_group(item)}")


def _group(item: pytest.Item) -> str:
    """The work unit of a test under ``--dist loadgroup``: its ``xdist_group``, or itself."""
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return item.nodeid
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


def _guess(item: pytest.Item, durations: dict[str, float]) -> float:
    if item.nodeid in durations:
        return durations[item.nodeid]
    return next((s for mark, s in GUESS_S.items() if item.get_closest_marker(mark)), GUESS_DEFAULT_S)


def _kind(item: pytest.Item) -> str:
    """How a test shares the machine under xdist (``_turn``): alone, loud, quiet, companion or plain."""
    for kind in ("alone", "loud"):
        if item.get_closest_marker(kind):
            return kind
    if _group(item) == QUIET_GROUP:
        return "quiet"
    return "companion" if any(item.get_closest_marker(d) for d in COMPANION_DIRECTORIES) else "plain"


def _longest_first(items: list[pytest.Item], durations: dict[str, float]) -> list[pytest.Item]:
    """Work units by their seconds, longest first, those with an ``alone`` test before all others,
    then each ``loud`` one followed by its share of the ``companion`` units; a unit's tests keep
    their order. ``alone`` ones first: one started later waits for every test running beside it
    to end, while the other workers, kept out, sit idle; at the start, nothing runs yet. Companions
    right behind a loud one: a worker runs its tests in the order it got them, so the other
    workers must have companions next to run beside it (each asks for more work once it has two
    tests or fewer left). Stable, so that every worker, given the same durations, collects the
    same order (xdist checks it)."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(_group(item), []).append(item)
    seconds = {name: sum(_guess(i, durations) for i in unit) for name, unit in units.items()}
    kinds = {name: min((_kind(i) for i in unit), key=KINDS.index) for name, unit in units.items()}
    by_time = sorted(units, key=lambda n: -seconds[n])
    quiet = [n for n in by_time if kinds[n] == "quiet"]
    alone = [n for n in by_time if kinds[n] == "alone"]
    loud = [n for n in by_time if kinds[n] == "loud"]
    companions = [n for n in by_time if kinds[n] == "companion"]
    rest = [n for n in by_time if kinds[n] == "plain"]
    beside: list[str] = []
    for i, name in enumerate(loud):  # the companions dealt round, the longest to the first
        beside += [name, *companions[i::len(loud)]]
    if not loud:
        rest = sorted(companions + rest, key=lambda n: -seconds[n])
    return [i for name in quiet + alone + beside + rest for i in units[name]]


KINDS = ("alone", "loud", "quiet", "companion", "plain")


def _test_id(nodeid: str) -> str:
    """A report's test id without the ``@group`` that loadgroup appends."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


class _Durations:
    """Each test's seconds in this run (all its phases), merged into pytest's cache at the end:
    what the next parallel run orders its tests by. Kept by the controller, or a serial run."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seen: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.skipped:
            test = _test_id(report.nodeid)
            self.seen[test] = round(self.seen.get(test, 0.0) + report.duration, 2)

    def pytest_sessionfinish(self) -> None:
        if self.seen and self.config.cache is not None:
            self.config.cache.set(DURATIONS_KEY, {**self.config.cache.get(DURATIONS_KEY, {}), **self.seen})


LOADGROUP_KEY = "brokerd/loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """What each xdist worker needs of the controller. The durations of the last runs, not read
    from the cache by each: a run finishing meanwhile could give two workers different orders.
    Whether the run is ``loadgroup``: a worker parses the command line again, not the options the
    controller's ``pytest_configure`` changed, and names a test's work unit by its group only then."""
    cache = node.config.cache
    node.workerinput[DURATIONS_KEY] = {**_committed_durations(),
                                       **(cache.get(DURATIONS_KEY, {}) if cache is not None else {})}
    node.workerinput[LOADGROUP_KEY] = node.config.option.dist == "loadgroup"


def _committed_durations() -> dict[str, float]:
    try:
        with open(DURATIONS_FILE, encoding="utf-8") as f:
            return {str(k): float(v) for k, v in json.load(f).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _shared(item: pytest.Item) -> str | None:
    """What a test shares with others: a session fixture of a test directory's conftest (the Spark
    session: a JVM, seconds to start and a GiB), named; else a module fixture (one broker for a
    whole file), its file."""
    info = getattr(item, "_fixtureinfo", None)
    defs = [d[-1] for d in info.name2fixturedefs.values() if d] if info is not None else []
    for d in defs:
        if d.scope == "session" and d.baseid.startswith("tests/"):
            return d.argname
    if any(d.scope in ("module", "package") for d in defs):
        return item.nodeid.split("::")[0]
    return None


def _xdist_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") != "no"


def pytest_configure(config: pytest.Config) -> None:
    """``-n N`` alone means ``--dist load``, which ignores ``xdist_group``: made ``loadgroup`` unless
    a ``--dist`` was asked for, in the workers' order (longest first, ``_longest_first``), not
    re-sorted by each unit's count of tests. The run's id is fixed here, so that the controller
    knows the directory of its workers' locks (``_turn``) and removes it after them."""
    if getattr(config, "workerinput", {}).get(LOADGROUP_KEY):
        config.option.loadgroup = True
    if not hasattr(config, "workerinput") and getattr(config, "cache", None) is not None:
        config.pluginmanager.register(_Durations(config), "brokerd-durations")
    if not _xdist_controller(config):
        return
    if config.option.dist == "load" and not any(a.startswith("--dist") or a == "-d"
                                                for a in config.invocation_params.args):
        config.option.dist = "loadgroup"
    if not any(a.startswith("--loadscope-reorder") for a in config.invocation_params.args):
        config.option.loadscopereorder = False
    if config.option.testrunuid is None:
        config.option.testrunuid = uuid.uuid4().hex


def pytest_unconfigure(config: pytest.Config) -> None:
    if _xdist_controller(config) and config.option.testrunuid:
        shutil.rmtree(_turn_dir(config.option.testrunuid), ignore_errors=True)


def _turn_dir(run: str) -> Path:
    return Path(tempfile.gettempdir()) / f"brokerd-tests-{run}"


TURNS = {  # kind: how it takes the room and the side room (None: not at all)
    "quiet": (None, None),
    "plain": (fcntl.LOCK_SH, None),
    "companion": (None, fcntl.LOCK_SH),
    "loud": (fcntl.LOCK_EX, fcntl.LOCK_SH),
    "alone": (fcntl.LOCK_EX, fcntl.LOCK_EX),
}
"""Under xdist, an ``alone`` test waits until no other test runs, and none starts until it is
done; a ``loud`` one lets only companions beside it; the others run side by side. Two lock
files, each taken shared or exclusive behind a turnstile of its own that every test taking it
passes on its way in: a waiting exclusive taker holds the turnstile, so the other workers' next
tests cannot keep the lock shared for ever. The room is taken before the side room, and the side
room exclusive only by a test that holds the room exclusive: no two tests wait on each other."""


# Under xdist, a test of a unit without an ``alone`` test starts once every ``alone`` test of the
# run is done. The workers get the units in order, ``alone`` ones first, but not at one pace: one
# that had finished its own went on to a Spark test (a JVM's start, 18 s), and an ``alone`` test
# of another worker, waiting for the room, held every other worker's next test at the turnstile
# behind it: one test ran on four workers for 37 s of a CI run. An ``alone`` test says it is done
# with a file of its own; a worker whose ``alone`` test never ends (it crashed) holds the others
# back ALONE_WAIT_S at most.
ALONE_TOTAL = pytest.StashKey[int]()
AFTER_ALONE = pytest.StashKey[bool]()
ALONE_WAIT_S = 600.0


def _alone_done(run: str) -> Path:
    return _turn_dir(run) / "alone-done"


def _wait_for_alone(run: str, total: int) -> None:
    """Until the run's ``total`` ``alone`` tests are done (bounded)."""
    done = _alone_done(run)
    deadline = time.monotonic() + ALONE_WAIT_S
    while time.monotonic() < deadline:
        if done.is_dir() and sum(1 for _ in done.iterdir()) >= total:
            return
        time.sleep(0.1)
    print(f"brokerd tests: {total} alone tests not all done after {ALONE_WAIT_S:.0f} s; going on")


@contextlib.contextmanager
def _turn(kind: str, after_alone: bool = False, alone_total: int = 0) -> Iterator[None]:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        yield
        return
    directory = _turn_dir(run)
    directory.mkdir(exist_ok=True)
    if after_alone and alone_total:
        _wait_for_alone(run, alone_total)
    with contextlib.ExitStack() as held:
        for name, how in zip(("room", "side"), TURNS[kind], strict=True):
            if how is not None:
                held.enter_context(_taken(directory, name, how))
        yield


@contextlib.contextmanager
def _taken(directory: Path, name: str, how: int) -> Iterator[None]:
    with open(directory / f"{name}.turnstile", "a") as gate, open(directory / name, "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, how)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Each test's setup, call and teardown (module fixtures' too) inside its turn."""
    kind = _kind(item)
    try:
        with _turn(kind, item.stash.get(AFTER_ALONE, False), item.config.stash.get(ALONE_TOTAL, 0)):
            return (yield)
    finally:
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
        if kind == "alone" and run:
            done = _alone_done(run)
            done.mkdir(parents=True, exist_ok=True)
            (done / hashlib.sha1(item.nodeid.encode()).hexdigest()).touch()


@pytest.fixture(scope="session")
def xprocess(request: pytest.FixtureRequest) -> Iterator[object]:
    """pytest-xprocess's fixture, with a directory of its own per xdist worker. A process's name
    there holds its pid file and log, and starting a name stops the pid recorded under it: two
    workers sharing the directory would have to keep every name apart, or stop each other's."""
    from xprocess import XProcess

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    rootdir = request.config.cache.makedir(f".xprocess-{worker}" if worker else ".xprocess")
    with XProcess(request.config, rootdir) as xproc:
        request.config._xprocess = xproc  # the plugin's clean-up on an interrupt looks for it here
        yield xproc


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Keep each phase's report on the test item, so that fixtures can tell whether it failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _print_log_tails(brokers: list[Broker]) -> None:
    """A failed test's brokers: the end of each one's log (xprocess shows only the startup), so a
    failure seen once in CI says what the broker did meanwhile."""
    for broker in brokers:
        if broker.logfile is None:
            continue
        try:
            lines = broker.logfile.read_text(errors="replace").splitlines()
        except OSError:
            continue
        print(f"--- last {LOG_TAIL_LINES} lines of {broker.name}'s log ---")
        print("\n".join(lines[-LOG_TAIL_LINES:]))


def _close_clients_made() -> None:
    made, Client.made[:] = list(Client.made), []
    Client.close_all(made)


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    """Close every paho client a test made, once it is over (see ``Client.made``). Tests with a
    broker have theirs closed by ``start_broker`` first, while the broker still runs: paho's
    threads are then in select(), which their socket pair wakes, not asleep before a reconnect."""
    yield
    _close_clients_made()


def _free_port_not_in(host: str, args: tuple[str, ...]) -> int:
    """A free port that no argument names (``_ports`` of a test may have picked it for a listener
    it passes: two free ports asked for one after the other can be the same)."""
    while True:
        port = free_port(host)
        if not any(a.endswith(f":{port}") or f":{port}/" in a for a in args):
            return port


@pytest.fixture
def start_broker(xprocess, tmp_path, request) -> Iterator[Callable[..., Broker]]:
    """Start brokerd with the given arguments; every broker started is stopped after the test.

    Defaults: two workers (routers joined by the mesh, as brokerd is deployed: a test then also
    covers the forwarded path wherever the kernel puts its clients) on 127.0.0.1, a free port (not
    one the arguments name for another listener), the data directory in the test's tmp_path. A test
    passes ``workers=1`` only where one worker is what it is about, and says why. A node of a
    multi-node test (started with ``--peer``) has one worker unless it asks for more: those tests
    are about nodes (tests/cluster/test_faults.py counts a node's one worker).
    """
    started: list[Broker] = []

    def start(*args: str, workers: int | None = None, host: str = "127.0.0.1", port: int | None = None,
              data_dir: str | None = None, node_id: str = "t", prefix: list[str] | None = None) -> Broker:
        if workers is None:
            workers = 1 if "--peer" in args else 2
        port = port or _free_port_not_in(host, args)
        argv = ["--workers", str(workers), "--listen", f"{host}:{port}", "--node-id", node_id,
                "--data-dir", data_dir or str(tmp_path / "data"), *args]
        broker = Broker(xprocess, f"brokerd-{next(_names)}-{port}", argv, host, port, prefix=prefix or [])
        started.append(broker)
        return broker.start()

    yield start
    _close_clients_made()
    call = getattr(request.node, "report_call", None)
    if call is not None and call.failed:
        _print_log_tails(started)
    stop_together(xprocess, [broker.name for broker in started])


@pytest.fixture
def broker(start_broker) -> Broker:
    return start_broker()


@pytest.fixture(scope="module")
def file_broker(xprocess, tmp_path_factory, request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A broker with ``start_broker``'s defaults for a whole test file, started once, not once a
    test (a second or two each, more on a busy box). Only for files whose tests can share one:
    each its own client ids (``cid``) and topics, nothing retained that another's wildcard would
    get, no log line or counter that another test could have made. Tests take it through
    ``on_file_broker``; under xdist the file stays on one worker (``_shared``). Two workers, or
    as many as the file's ``FILE_BROKER_WORKERS`` says."""
    workers = getattr(request.module, "FILE_BROKER_WORKERS", 2)
    port = _free_port_not_in("127.0.0.1", ())
    argv = ["--workers", str(workers), "--listen", f"127.0.0.1:{port}", "--node-id", "t",
            "--data-dir", str(tmp_path_factory.mktemp("file-broker"))]
    broker = Broker(xprocess, f"brokerd-{next(_names)}-{port}", argv, "127.0.0.1", port).start()
    yield broker
    info = xprocess.getinfo(broker.name)
    if info.isrunning():
        info.terminate(timeout=15)


@pytest.fixture
def on_file_broker(file_broker: Broker, request: pytest.FixtureRequest) -> Iterator[Broker]:
    """``file_broker`` for one test: the clients it made are closed after it, while the broker
    runs (as ``start_broker`` does), and if it failed, what the broker logged during it is shown."""
    start = file_broker.logfile.stat().st_size if file_broker.logfile else 0
    yield file_broker
    _close_clients_made()
    call = getattr(request.node, "report_call", None)
    if call is not None and call.failed and file_broker.logfile is not None:
        with open(file_broker.logfile, "rb") as f:
            f.seek(start)
            lines = f.read().decode(errors="replace").splitlines()
        print(f"--- last {LOG_TAIL_LINES} lines {file_broker.name} logged during the test ---")
        print("\n".join(lines[-LOG_TAIL_LINES:]))


if __name__ == "__main__":  # python3 -m tests.conftest CACHE_DIR: DURATIONS_FILE from that run's cache
    import sys

    with open(Path(sys.argv[1]) / "v" / DURATIONS_KEY, encoding="utf-8") as f:
        seen = json.load(f)
    # Those of a second or more: the rest are guessed by marker well enough to order by.
    kept = {k: round(v, 1) for k, v in sorted(seen.items()) if v >= 1.0}
    DURATIONS_FILE.write_text(json.dumps(kept, indent=0) + "\n", encoding="utf-8")
