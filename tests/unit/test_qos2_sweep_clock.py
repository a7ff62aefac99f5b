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
