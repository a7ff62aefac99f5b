"""MQTT 5 Session Expiry Interval (3.1.2.11.2) against a fake clock: an offline session with a
finite interval ends when it runs out, with its subscriptions; a resumed one, or one without an
interval to run out, stays."""

from __future__ import annotations

import pytest

from brokerd.connection.packets import Subscription
from brokerd.router.clock import FakeClock
from brokerd.router.router import Router, RouterConfig
from tests.unit.conftest import FakeConn

pytestmark = pytest.mark.unit


def offline(expiry_s: int):
    clock = FakeClock()
    r = Router(RouterConfig(), clock=clock)
    s = r.new_session("s", True)
    s.expiry_s = expiry_s
    r.subscribe(s, Subscription("a/#", 1))
    return clock, r, s


def test_an_offline_session_ends_when_its_interval_runs_out():
    clock, r, s = offline(30)
    r.schedule_expiry(s)
    clock.advance(29.9)
    assert r.sessions.get("s") is s and len(r.subs) == 1
    clock.advance(0.2)
    assert "s" not in r.sessions and len(r.subs) == 0 and r.local_filters == {}


def test_a_session_resumed_before_its_interval_runs_out_stays():
    clock, r, s = offline(30)
    r.schedule_expiry(s)
    clock.advance(10)
    r.cancel_expiry("s")  # a CONNECT resumed it
    s.attach(FakeConn())  # type: ignore[arg-type]
    clock.advance(60)
    assert r.sessions.get("s") is s and clock.pending == 0


def test_a_session_connected_when_its_timer_fires_stays():
    clock, r, s = offline(5)
    r.schedule_expiry(s)
    s.attach(FakeConn())  # type: ignore[arg-type]
    clock.advance(6)
    assert r.sessions.get("s") is s


@pytest.mark.parametrize("expiry_s", [0, 0xFFFFFFFF])
def test_no_timer_for_a_session_that_ends_with_its_connection_or_never(expiry_s):
    clock, r, s = offline(expiry_s)
    r.schedule_expiry(s)
    assert clock.pending == 0
    clock.advance(10 ** 7)
    assert r.sessions.get("s") is s


def test_a_rescheduled_expiry_counts_from_the_new_disconnect():
    clock, r, s = offline(10)
    r.schedule_expiry(s)
    clock.advance(8)
    r.cancel_expiry("s")
    r.schedule_expiry(s)  # connected and gone again
    clock.advance(8)
    assert r.sessions.get("s") is s
    clock.advance(2.1)
    assert "s" not in r.sessions

