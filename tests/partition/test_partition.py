"""Partitions on real links: three nodes in network namespaces of their own, joined by a bridge,
cut apart by iptables rules and a link set down, SIGKILLed and restarted, SIGSTOPped past the mesh
timeout, while QoS 1 traffic runs (about 45 publishes a second) and persistent subscribers come
back wherever a load balancer sends them. The invariants are the chaos suite's. Seeded and
bounded; ``PARTITION_SEED=<seed>`` replays a run's schedule. Runs only with ``BROKERD_PARTITION=1``
(conftest.py says why); ``scripts/partition`` runs several seeds."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos.harness import Report
from tests.helpers import Broker, add_user
from tests.partition.netns import Lab
from tests.partition.scenario import FAULTS, PartitionScenario, partition_seed, start_nodes

# Session ownership agreed through Raft (--agreement): the default; TEST_AGREEMENT=0 runs the lease rules.
AGREEMENT = os.environ.get("TEST_AGREEMENT", "1") == "1"
PERIOD = 0.13  # each of six publishers: about 45 QoS 1 publishes a second in all
# The faults' wall-clock cap (a run: about 90 s with start-up and the checks); PARTITION_CAP_S
# raises it for a schedule of more faults (PARTITION_FAULTS).
CAP_S = float(os.environ.get("PARTITION_CAP_S", "60"))


def schedule() -> list[str]:
    """The faults of a run: ``FAULTS``, or ``PARTITION_FAULTS`` ("link-down:8": eight link-downs
    under the same load, to make a rare outcome of one kind of fault common; "kind:count,...")."""
    value = os.environ.get("PARTITION_FAULTS")
    if not value:
        return list(FAULTS)
    kinds = []
    for part in value.split(","):
        kind, _, count = part.strip().partition(":")
        if kind not in PartitionScenario.fault_kinds:
            raise ValueError(f"PARTITION_FAULTS: {kind!r} is none of {', '.join(PartitionScenario.fault_kinds)}")
        kinds += [kind] * int(count or 1)
    return kinds


def summary(seed: int, report: Report) -> str:
    """One line per run, for scripts/partition: passed or not, and what was violated."""
    if not report.violations:
        return f"partition seed={seed} passed"
    lost = sum(int(m.group(1)) for v in report.violations if (m := re.search(r": lost (\d+) of \d+ ack", v)))
    subscribers = sum(1 for v in report.violations if re.search(r": lost \d+ of \d+ ack", v))
    empty = sum(1 for v in report.violations if "session present = 0" in v)
    converge = sum(1 for v in report.violations if "interest tables" in v or "do not deliver" in v)
    other = len(report.violations) - subscribers - empty - converge
    return (f"partition seed={seed} FAILED lost={lost} (subscribers {subscribers}) empty-sessions={empty} "
            f"not-converged={converge} other={other}")


@pytest.mark.partition
def test_partition_on_real_links(lab: Lab, start_broker: Callable[..., Broker], record_property: Callable,
                                 tmp_path: Path) -> None:
    """Every client authenticates (a password file, ACLs on the chaos topics): a session that lost
    its identity in a move would be refused what it is owed."""
    seed = partition_seed()
    print(f"partition seed={seed} network {lab.prefix}.0/24")
    password = f"partition-pw-{seed}"
    add_user(tmp_path / "passwd", "chaos", password)
    (tmp_path / "acl").write_text("user chaos\ntopic readwrite chaos/#\ntopic readwrite chaosprobe/#\n")
    secured = ["--password-file", str(tmp_path / "passwd"), "--acl-file", str(tmp_path / "acl")]
    credentials = ("chaos", password)
    try:
        nodes = start_nodes(start_broker, lab, secured, credentials, agreement=AGREEMENT,
                            names=os.environ.get("PARTITION_NAMES", "abc"))  # another lab at once: other names
    except AssertionError as exc:
        raise AssertionError(f"{exc} (PARTITION_SEED={seed})") from None
    sc = PartitionScenario("partition", seed, nodes, credentials)
    sc.populate(nodes, period=PERIOD)
    sc.start()
    sc.run(schedule(), CAP_S)  # each fault heals what it cut, also when it fails half way
    report = sc.finish()
    line = summary(seed, report)
    print(line)
    print(report.message() if report.violations else report.line)
    record_property("partition", report.line)
    assert not report.violations, f"{line} (replay: PARTITION_SEED={seed})\n{report.message()}"
