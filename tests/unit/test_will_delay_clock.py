"""MQTT 5 Will Delay Interval (3.1.3.2.2) against a fake clock: a delayed will goes out when its
delay runs out or its session ends, whichever comes first, and never if the session is resumed
before."""

from __future__ import annotations

import pytest

from brokerd.connection.packets import Publish
from brokerd.router.clock import FakeClock
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from tests.unit.conftest import FakeConn, online

pytestmark = pytest.mark.unit


def setup(expiry_s: int = 0):
    clock = FakeClock()
    r = Router(RouterConfig(), clock=clock)
    _, watcher = online(r, "watcher", ("will/#", 0))
    s = r.new_session("gone", True)
    s.expiry_s = expiry_s
    return clock, r, s, watcher


def wills(conn: FakeConn) -> list[str]:
    return [p.topic for p in conn.packets() if isinstance(p, Publish)]


def test_a_delayed_will_goes_out_when_its_delay_runs_out():
    clock, r, s, watcher = setup()
    r.delay_will(s, Message("will/gone", b"bye", client_id="gone"), 5)
    clock.advance(4.9)
    assert wills(watcher) == []
    clock.advance(0.2)
    assert wills(watcher) == ["will/gone"] and r.stats.wills_published == 1
    assert s.will is None


def test_a_will_is_stamped_when_it_goes_out_not_when_it_was_delayed():
    clock, r, s, _ = setup()
    will = Message("will/gone", b"bye", client_id="gone", timestamp_ms=0)
    r.delay_will(s, will, 7)
    assert s.will_due_ms == int(clock.unix() * 1000) + 7000
    clock.advance(8)
    assert will.timestamp_ms == int((clock.unix() - 1) * 1000)


def test_a_session_resumed_before_the_delay_keeps_its_will_unpublished():
    clock, r, s, watcher = setup()
    r.delay_will(s, Message("will/gone", b"bye", client_id="gone"), 5)
    s.attach(FakeConn())  # type: ignore[arg-type]
    clock.advance(10)
    assert wills(watcher) == [] and r.stats.wills_published == 0


def test_a_cancelled_will_never_goes_out():
    clock, r, s, watcher = setup()
    r.delay_will(s, Message("will/gone", b"bye", client_id="gone"), 5)
    r.cancel_will("gone")
    clock.advance(10)
    assert wills(watcher) == [] and clock.pending == 0


def test_a_session_that_expires_first_takes_its_will_out_with_it():
    clock, r, s, watcher = setup(expiry_s=3)
    r.delay_will(s, Message("will/gone", b"bye", client_id="gone"), 60)
    r.schedule_expiry(s)
    clock.advance(3.1)
    assert "gone" not in r.sessions
    assert wills(watcher) == ["will/gone"] and r.stats.wills_published == 1
    clock.advance(120)
    assert r.stats.wills_published == 1  # not again when the delay would have run out


def test_a_rearmed_will_waits_for_the_rest_of_its_delay_and_at_least_the_grace():
    clock, r, s, watcher = setup()
    r.delay_will(s, Message("will/gone", b"bye", client_id="gone"), 10)
    clock.advance(6)
    r.rearm_will(s)  # (a takeover that broke off, say): 4 s left
    clock.advance(3.9)
    assert wills(watcher) == []
    clock.advance(0.2)
    assert wills(watcher) == ["will/gone"]
    r.delay_will(s, Message("will/gone", b"again", client_id="gone"), 1)
    clock.advance(0.5)
    r.rearm_will(s, at_least=5)  # a restart's grace: longer than what is left
    clock.advance(4.9)
    assert r.stats.wills_published == 1
    clock.advance(0.2)
    assert r.stats.wills_published == 2


def test_a_reload_that_removes_a_user_drops_its_delayed_wills_only():
    """A delayed will is a publish as its user, later: one whose user a reload removed is
    dropped. A user that was not in the previous file either (a certificate's identity) keeps
    its will, and so does one still in the file."""
    from brokerd.router.access import install_auth
    from brokerd.router.auth import Auth

    clock, r, s, watcher = setup()
    install_auth(r, Auth(passwords={"alice": "x", "keep": "y"}))
    s.username = "alice"
    others = {}
    for user in ("keep", "cert-dev"):
        others[user] = o = r.new_session(user, True)
        o.username = user
        r.delay_will(o, Message(f"will/{user}", b"bye", client_id=user), 5)
    r.delay_will(s, Message("will/gone", b"bye", client_id="gone"), 5)
    install_auth(r, Auth(passwords={"keep": "y"}))
    assert s.will is None and others["keep"].will is not None and others["cert-dev"].will is not None
    clock.advance(6)
    assert sorted(wills(watcher)) == ["will/cert-dev", "will/keep"]
