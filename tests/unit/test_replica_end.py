"""Where the replica that served a session from a silent router ended (``replica_end``): the
new owner asks the best replica of that router for what lies beyond (partition seed 11, where a
follower placed anew held records that the one serving the session lacked)."""

from __future__ import annotations

import pytest

from brokerd.cluster.replication.catchup import replica_end


def test_the_header_names_where_the_silent_routers_replica_ended() -> None:
    state = {"replica": "c/w1", "handon_from": [1_700_000_000_000, {"c/w1": 4711}]}
    assert replica_end(state, "c/w1") == 4711


@pytest.mark.parametrize("handon_from", [None, [1, {}], [1, {"c/w1": -1}], [1, {"c/w1": None}], "junk",
                                         [1, {"c/w1": 5}, 3]])
def test_a_header_that_does_not_say_asks_for_nothing_more(handon_from: object) -> None:
    assert replica_end({"replica": "c/w1", "handon_from": handon_from}, "c/w1") is None
