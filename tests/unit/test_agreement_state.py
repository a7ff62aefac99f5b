"""The agreed state as a pure machine (cluster.agreement.state): moves, fencing by epoch,
batches and transactions, members, in-sync sets, snapshots."""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.cluster.agreement import state as S
from brokerd.cluster.agreement.state import BAD, OK, SESSION, STALE, State


def test_a_session_nobody_holds_is_claimed_from_none_at_epoch_zero():
    s = State()
    assert s.apply(S.move(SESSION, "c1", None, 0, "a/0")) == (OK, "a/0", 1)
    assert s.owner(SESSION, "c1") == ("a/0", 1)
    assert s.apply(S.get(SESSION, "nobody")) == (OK, None, 0)


def test_a_move_commits_only_from_the_record_that_holds_and_raises_the_epoch():
    s = State()
    s.apply(S.move(SESSION, "c1", None, 0, "a/0"))
    assert s.apply(S.move(SESSION, "c1", "a/0", 1, "b/0")) == (OK, "b/0", 2)
    # the old owner, acting on the record it last saw, is fenced: told what holds instead
    assert s.apply(S.move(SESSION, "c1", "a/0", 1, "a/0")) == (STALE, "b/0", 2)
    assert s.apply(S.release(SESSION, "c1", "a/0", 1)) == (STALE, "b/0", 2)
    assert s.owner(SESSION, "c1") == ("b/0", 2)


def test_two_claims_from_one_record_see_one_winner():
    s = State()
    s.apply(S.move(SESSION, "c1", None, 0, "a/0"))
    first, second = s.apply_batch([S.move(SESSION, "c1", "a/0", 1, "b/0"), S.move(SESSION, "c1", "a/0", 1, "c/0")])
    assert first == (OK, "b/0", 2) and second == (STALE, "b/0", 2)


def test_an_epoch_never_comes_back_after_a_release_and_a_new_claim():
    s = State()
    s.apply(S.move(SESSION, "c1", None, 0, "a/0"))
    s.apply(S.move(SESSION, "c1", "a/0", 1, "b/0"))
    assert s.apply(S.release(SESSION, "c1", "b/0", 2)) == (OK, None, 2)
    assert s.owner(SESSION, "c1") == (None, 0)
    _, owner, epoch = s.apply(S.move(SESSION, "c1", None, 0, "a/0"))
    assert (owner, epoch) == ("a/0", 3)  # a router still holding ("a/0", 1) stays fenced
    assert s.apply(S.move(SESSION, "c1", "a/0", 1, "c/0"))[0] == STALE


def test_kinds_are_separate_so_bridges_and_shared_groups_fit_beside_sessions():
    s = State()
    s.apply(S.move(SESSION, "x", None, 0, "a/0"))
    assert s.apply(S.move("bridge", "x", None, 0, "b/1")) == (OK, "b/1", 2)
    assert s.owner(SESSION, "x") == ("a/0", 1) and s.count("bridge") == 1


def test_a_transaction_commits_all_its_moves_or_none():
    s = State()
    s.apply(S.move(SESSION, "c1", None, 0, "a/0"))
    s.apply(S.move(SESSION, "c2", None, 0, "a/0"))
    before = s.snapshot()
    failed = s.apply(S.all_of([S.move(SESSION, "c1", "a/0", 1, "b/0"), S.move(SESSION, "c2", "a/0", 1, "b/0"),
                               S.move("group", "g", None, 0, "b/0")]))
    assert failed == (STALE, 1, (STALE, "a/0", 2))
    assert s.snapshot() == before  # c1's move and the epoch it took are undone
    done = s.apply(S.all_of([S.move(SESSION, "c1", "a/0", 1, "b/0"), S.move(SESSION, "c2", "a/0", 2, "b/0")]))
    assert done == (OK, ((OK, "b/0", 3), (OK, "b/0", 4)))


def test_a_malformed_command_changes_nothing_and_is_answered_bad_on_every_replica():
    s = State()
    before = s.snapshot()
    for c in [(), ("nope",), ("move", SESSION), ("move", SESSION, "k", None, 0, 7), ("join", "a", "x", -1), 5]:
        assert s.apply(c)[0] == BAD
    assert s.snapshot() == before


def test_members_join_with_rising_incarnations_and_an_old_process_cannot_replace_a_new_one():
    s = State()
    assert s.apply(S.join("a", "10.0.0.1:7000", 1)) == (OK, "10.0.0.1:7000", 1)
    assert s.apply(S.join("a", "10.0.0.1:7000", 1)) == (OK, "10.0.0.1:7000", 1)  # said again
    assert s.apply(S.join("a", "10.0.0.9:7000", 1)) == (STALE, "10.0.0.1:7000", 1)
    assert s.apply(S.join("a", "10.0.0.2:7000", 2)) == (OK, "10.0.0.2:7000", 2)
    assert s.apply(S.join("a", "10.0.0.1:7000", 1)) == (STALE, "10.0.0.2:7000", 2)
    assert s.apply(S.leave("a", 1)) == (STALE, "10.0.0.2:7000", 2)
    assert s.apply(S.leave("a", 2)) == (OK, None, 2) and s.members == {}


def test_an_older_leader_epoch_cannot_change_a_logs_in_sync_followers():
    s = State()
    assert s.apply(S.insync("a/0", 3, ["b", "c"])) == (OK, 3, ("b", "c"))
    assert s.apply(S.insync("a/0", 3, ["b"])) == (OK, 3, ("b",))  # the leader shrinks its own set
    assert s.apply(S.insync("a/0", 2, ["b", "c"])) == (STALE, 3, ("b",))
    assert s.insync["a/0"] == (3, frozenset({"b"}))


def test_a_snapshot_is_plain_msgpack_and_restores_the_same_state():
    s = State()
    s.apply_batch([S.move(SESSION, f"c{i}", None, 0, "a/0") for i in range(5)]
                  + [S.join("a", "h:1", 4), S.insync("a/0", 1, ["b"]), S.move("bridge", "up", None, 0, "b/0")])
    snap = msgpack.unpackb(msgpack.packb(s.snapshot()), strict_map_key=False)
    again = State.restore(snap)
    assert again.snapshot() == s.snapshot()
    assert again.apply(S.move(SESSION, "c9", None, 0, "b/0")) == s.apply(S.move(SESSION, "c9", None, 0, "b/0"))


owners = st.sampled_from(["a/0", "b/0", "c/0"])
keys = st.sampled_from(["k1", "k2", "k3"])
single = st.one_of(
    st.builds(lambda k, o, e, t: S.move(SESSION, k, o, e, t), keys, st.none() | owners, st.integers(0, 6), owners),
    st.builds(lambda k, o, e: S.release(SESSION, k, o, e), keys, owners, st.integers(0, 6)),
)
commands = st.one_of(single, st.builds(S.all_of, st.lists(single, max_size=4)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(commands, max_size=6), max_size=12))
def test_replicas_applying_one_order_agree_and_each_keys_epoch_only_grows(batches):
    """Two replicas, one in whole batches and one command at a time, and one restored from a
    snapshot halfway, end equal; and no key is ever held again at an epoch it held before, also
    through transactions that failed and were undone."""
    a, b = State(), State()
    seen: dict[str, int] = {}
    for i, batch in enumerate(batches):
        results = a.apply_batch(batch)
        assert results == [b.apply(c) for c in batch]
        for r, c in zip(results, batch, strict=True):
            done = zip(r[1], c[1], strict=True) if c[0] == "all" and r[0] == OK else [(r, c)]
            for result, command in done:
                if result[0] == OK and command[0] == "move":
                    assert result[2] > seen.get(command[2], 0)
                    seen[command[2]] = result[2]
        if i == len(batches) // 2:
            b = State.restore(b.snapshot())
    assert a.snapshot() == b.snapshot()


def _as_msgpack(commands: list) -> list:
    """Commands as a worker's request brings them to the node's service: lists, not tuples."""
    return msgpack.unpackb(msgpack.packb(commands))


def test_commands_as_msgpack_lists_apply_like_tuples_nested_transactions_and_followers_too():
    commands = [S.move(SESSION, "c1", None, 0, "a/0"), S.insync("a/0", 2, ["c", "b"]), S.join("a", "h:1", 7),
                S.all_of([S.move(SESSION, "c1", "a/0", 1, "b/0"), S.all_of([S.move(SESSION, "c2", None, 0, "b/0")])]),
                S.all_of([S.move(SESSION, "c3", None, 0, "b/0"), S.release(SESSION, "c1", "a/0", 1)]),
                S.release(SESSION, "c2", "b/0", 3), S.get(SESSION, "c1"), S.leave("a", 7)]
    lists = _as_msgpack(commands)
    assert all(isinstance(c, list) for c in lists) and isinstance(lists[3][1][1][1], list)
    as_tuples, as_lists = State(), State()
    assert as_lists.apply_batch(lists) == as_tuples.apply_batch(commands)
    assert as_lists.snapshot() == as_tuples.snapshot()
    assert as_lists.owner(SESSION, "c1") == ("b/0", 2) and as_lists.insync["a/0"] == (2, frozenset({"b", "c"}))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(commands, max_size=6), max_size=8))
def test_any_batches_as_msgpack_lists_end_in_the_state_their_tuples_make(batches):
    as_tuples, as_lists = State(), State()
    for batch in batches:
        assert as_lists.apply_batch(_as_msgpack(batch)) == as_tuples.apply_batch(batch)
    assert as_lists.snapshot() == as_tuples.snapshot()


def test_malformed_list_commands_answer_bad_and_change_nothing():
    s = State()
    for junk in ([[]], [["move"]], [{"move": 1}], [["move", ["k"], "c1", None, 0, "a/0"]], [["release", [1], "c", "a", 1]],
                 [["all", 5]], [["insync", "a/0", 1, [["b"]]]]):
        assert s.apply(junk[0])[0] == BAD, junk
    assert s.snapshot() == State().snapshot()
