"""--qos2-timeout against a fake clock: a received QoS 2 packet id whose PUBREL never comes is
forgotten after one to two timeouts, and the sweep's timer stops when nothing is left to sweep."""

from __future__ import annotations

import pytest

from brokerd.router.clock import FakeClock
from brokerd.router.limits import ClientLimits
from brokerd.router.router import Router, RouterConfig

pytestmark = pytest.mark.unit


def test_qos2_ids_without_pubrel_are_forgotten_after_one_to_two_timeouts():
    clock = FakeClock()
    r = Router(RouterConfig(limits=ClientLimits(qos2_timeout=10)), clock=clock)
    s = r.new_session("q", True)
    s.qos2_ids().add(7)
    r.qos2_sweeper.track(s)
    clock.advance(10.1)  # the first sweep only notes it
    assert 7 in s.inbound_qos2
    s.qos2_ids().add(8)  # came after that sweep: the next one only notes it
    clock.advance(10)
    assert s.inbound_qos2 == {8} and r.stats.limit_qos2_expired == 1
    clock.advance(10)
    assert not s.inbound_qos2 and r.stats.limit_qos2_expired == 2 and clock.pending == 0


def test_an_id_released_in_time_is_not_counted():
    clock = FakeClock()
    r = Router(RouterConfig(limits=ClientLimits(qos2_timeout=10)), clock=clock)
    s = r.new_session("q", True)
    s.qos2_ids().add(3)
    r.qos2_sweeper.track(s)
    clock.advance(5)
    s.inbound_qos2.discard(3)  # its PUBREL came
    clock.advance(30)
    assert r.stats.limit_qos2_expired == 0 and clock.pending == 0


def test_ids_a_session_brings_are_forgotten_where_it_arrives():
    """A session taken over (or restored) with ids awaiting PUBREL: its next ids find the set not
    empty and do not track it, so it is tracked when it arrives, and its ids go 1 to 2 timeouts
    from then."""
    old = Router(RouterConfig(router_id="r1"))
    s = old.new_session("q", True)
    s.qos2_ids().add(7)
    clock = FakeClock()
    r = Router(RouterConfig(router_id="r2", limits=ClientLimits(qos2_timeout=10)), clock=clock)
    moved = r.import_session("q", s.export_state())
    assert moved.inbound_qos2 == {7}
    moved.qos2_ids().add(8)  # as its next QoS 2 PUBLISH adds it (not tracking it)
    clock.advance(20.1)
    assert not moved.inbound_qos2 and r.stats.limit_qos2_expired == 2 and clock.pending == 0
    none = r.import_session("n", old.new_session("n", True).export_state())
    assert none.client_id not in r.qos2_sweeper.tracked  # nothing to time: no timer


def test_ids_restored_from_a_snapshot_are_forgotten(tmp_path):
    from brokerd.router.persistence import StateStore

    first = Router(RouterConfig(router_id="r1"))
    s = first.new_session("q", True)
    s.expiry_s = 3600
    s.qos2_ids().add(7)
    StateStore(first, str(tmp_path)).write_now()
    clock = FakeClock()
    second = Router(RouterConfig(router_id="r1", limits=ClientLimits(qos2_timeout=10)), clock=clock)
    StateStore(second, str(tmp_path)).load()
    assert second.sessions["q"].inbound_qos2 == {7}
    clock.advance(20.1)
    assert not second.sessions["q"].inbound_qos2 and second.stats.limit_qos2_expired == 1
