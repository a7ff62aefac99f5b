"""The sessions held for other routers (``cluster.replication.session_store``) driven by hand:
SESSION_STATE and SESSION_GONE in, what is held, what is dirty and what a takeover gets out. No
mesh, no disk."""

from __future__ import annotations

from brokerd.cluster.replication.session_store import SessionStore, changes


def state(epoch: int = 0, arrived: int = 0, will: list | None = None) -> dict:
    return {"subs": [], "epoch": epoch, "arrived": arrived, "will": will, "live_will": None}


def test_the_leader_sends_what_changed_and_none_for_what_is_gone():
    sent = {"x": state(1), "y": state(1), "z": state(1)}
    now = {"x": state(1), "y": state(2), "n": state(1)}
    assert changes(sent, now) == {"y": state(2), "n": state(1), "z": None}
    assert changes(now, now) == {}


def test_a_full_set_replaces_what_is_held_and_changes_add_and_remove():
    store = SessionStore()
    store.apply("a/w0", True, {"x": state(), "y": state()})
    store.apply("a/w0", False, {"y": None, "z": state()})
    assert store.held == {"a/w0": {"x": state(), "z": state()}}
    store.apply("a/w0", True, {"q": state()})
    assert store.held == {"a/w0": {"q": state()}}
    assert store.take_dirty() == {"a/w0"} and store.take_dirty() == set()


def test_a_session_gone_is_forgotten_and_a_will_published_elsewhere_is_not_held_again():
    store = SessionStore()
    store.apply("a/w0", True, {"x": state(will=[["t", b"w"], 5]), "y": state()})
    store.take_dirty()
    assert store.forget("a/w0", ["y"], ["x"])
    assert list(store.held["a/w0"]) == ["x"] and store.held["a/w0"]["x"]["will"] is None
    assert store.take_dirty() == {"a/w0"}
    assert not store.forget("a/w0", ["unknown"], ["other"]) and store.dirty == set()
    assert not store.forget("b/w0", ["x"])


def test_only_a_silent_routers_sessions_are_found_and_the_newest_copy_counts():
    store = SessionStore()
    store.apply("a/w0", True, {"x": state(epoch=1, arrived=10)})
    store.apply("a/w1", True, {"x": state(epoch=2, arrived=5)})
    store.apply("b/w0", True, {"x": state(epoch=9, arrived=99)})
    found = store.found("x", hears=lambda rid: rid == "b/w0")
    assert [p for p, _ in found] == ["a/w0", "a/w1"]
    assert store.newest(found)[0] == "a/w1"
    assert store.found("nobody", hears=lambda rid: False) == []
    assert store.holds("x") and not store.holds("nobody")


def test_a_handover_drops_the_stale_copies_at_once_and_the_copy_only_once_taken():
    store = SessionStore()
    st = state(epoch=2)
    store.apply("a/w0", True, {"x": state(epoch=1)})
    store.apply("a/w1", True, {"x": st})
    store.take_dirty()
    store.hand("x", "a/w1", st, ["a/w0"])
    assert "x" not in store.held["a/w0"] and store.take_dirty() == {"a/w0"}
    assert store.handing == {"x": ("a/w1", st)}
    assert not store.moved("x", False)  # the transfer failed: it stays held
    assert store.held["a/w1"] == {"x": st} and store.handing == {}
    store.hand("x", "a/w1", st, [])
    assert store.moved("x", True) and store.held["a/w1"] == {} and store.take_dirty() == {"a/w1"}
    assert not store.moved("x", True)  # (nothing being handed)


def test_a_copy_replaced_during_its_handover_is_kept():
    store = SessionStore()
    st = state(epoch=1)
    store.apply("a/w0", True, {"x": st})
    store.hand("x", "a/w0", st, [])
    store.apply("a/w0", False, {"x": state(epoch=2)})  # the leader sent a newer state meanwhile
    assert not store.moved("x", True) and store.held["a/w0"]["x"]["epoch"] == 2


def test_a_restart_loads_only_a_non_empty_map_and_stats_count_delayed_wills():
    store = SessionStore()
    store.load("a/w0", [])
    store.load("a/w1", {})
    store.load("a/w2", {"x": state(will=[["t"], 1]), "y": state()})
    assert list(store.held) == ["a/w2"]
    assert store.counts() == {"a/w2": 2} and store.delayed_wills() == {"a/w2": 1}
    assert store.clear_will("a/w2", "x") and store.delayed_wills() == {} and store.dirty == {"a/w2"}
