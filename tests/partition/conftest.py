"""The partition suite runs only when asked (``BROKERD_PARTITION=1``) and where it can (root, ip,
iptables); its ``lab`` fixture makes the network and removes it, also after a failure."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.partition.netns import Lab, missing

NOT_YET = ("known to lose acknowledged messages until issue 41's agreement work lands; "
           "run BROKERD_PARTITION=1 ./scripts/test tests/partition")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("BROKERD_PARTITION") == "1":
        return
    for item in items:
        if item.get_closest_marker("partition") is not None:
            item.add_marker(pytest.mark.skip(reason=NOT_YET))


@pytest.fixture
def lab() -> Iterator[Lab]:
    """A bridge and three node namespaces (tests/partition/netns.py). Requested before
    ``start_broker``, it is removed after the brokers in it are stopped."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    made = Lab.open(3)
    try:
        yield made
    finally:
        made.close()
