"""Topic filters and the trie, against the examples of the MQTT 3.1.1 spec (4.7) and a reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.router.message import Message
from brokerd.router.retained import TOMBSTONE_CHARS, RetainedStore
from brokerd.router.topics import (
    CACHED_TOPIC_MAX,
    TopicIndex,
    filter_matches,
    valid_topic_filter,
    valid_topic_name,
)

SPEC = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "anything/at/all", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/tranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("#", "$SYS/x", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
]


@pytest.mark.parametrize(("f", "t", "ok"), SPEC)
def test_spec_examples(f, t, ok):
    assert filter_matches(f, t) is ok
    idx: TopicIndex[str, int] = TopicIndex()
    idx.add(f, "k", 1)
    assert (idx.match(t) == [("k", 1)]) is ok
    store = RetainedStore()
    store.set(Message(t, b"v", retain=True))
    assert ([m.topic for m in store.match(f)] == [t]) is ok


@pytest.mark.parametrize("f", ["sport/tennis/#", "sport/+/player1", "+", "#", "+/+", "a//b", "/"])
def test_valid_filters(f):
    assert valid_topic_filter(f)


@pytest.mark.parametrize("f", ["", "sport/tennis#", "sport/tennis/#/ranking", "sport+", "a/#/b", "#/", "a\x00b"])
def test_invalid_filters(f):
    assert not valid_topic_filter(f)


def test_topic_names():
    assert valid_topic_name("a/b")
    assert not valid_topic_name("a/+")
    assert not valid_topic_name("")
    assert not valid_topic_name("a/#")


def test_remove_prunes_and_cache_invalidates():
    idx: TopicIndex[str, int] = TopicIndex()
    idx.add("a/+", "x", 1)
    assert idx.match("a/b") == [("x", 1)]
    idx.add("a/#", "y", 2)
    assert sorted(idx.match("a/b")) == [("x", 1), ("y", 2)]
    assert idx.remove("a/+", "x")
    assert idx.match("a/b") == [("y", 2)]
    assert idx.remove("a/#", "y")
    assert idx.match("a/b") == [] and len(idx) == 0
    assert idx._root.children == {}
    assert list(idx.items()) == []


levels = st.sampled_from(["a", "b", "", "$x", "c"])
topics = st.lists(levels, min_size=1, max_size=4).map("/".join)
filters = st.lists(st.sampled_from(["a", "b", "", "+", "$x", "c"]), min_size=1, max_size=4).flatmap(
    lambda ls: st.sampled_from(["/".join(ls), "/".join(ls) + "/#", "#"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(filters, max_size=8), topics)
def test_trie_and_retained_agree_with_the_reference(fs, topic):
    idx: TopicIndex[int, str] = TopicIndex()
    for i, f in enumerate(fs):
        idx.add(f, i, f)
    got = sorted(k for k, _ in idx.match(topic))
    assert got == sorted(i for i, f in enumerate(fs) if filter_matches(f, topic))
    store = RetainedStore()
    store.set(Message(topic, b"v", retain=True))
    for f in fs:
        assert bool(store.match(f)) == filter_matches(f, topic)


# -- deep topics: the trie itself has no depth limit (that is the codec's), so it must not recurse ---

DEEP = 1500  # beyond CPython's default recursion limit of 1000


def test_deep_filters_and_topics_in_the_index_do_not_recurse():
    deep_topic = "/".join(f"l{i}" for i in range(DEEP))
    idx: TopicIndex[str, int] = TopicIndex()
    idx.add(deep_topic, "exact", 1)
    idx.add("/".join(["+"] * DEEP), "plus", 2)
    idx.add("/".join(["+"] * (DEEP - 1)) + "/#", "plus-hash", 3)
    idx.add("l0/#", "hash", 4)
    idx.add("/".join(["+"] * (DEEP + 1)), "too-deep", 5)
    assert sorted(idx.match(deep_topic)) == [("exact", 1), ("hash", 4), ("plus", 2), ("plus-hash", 3)]
    assert idx.get(deep_topic, "exact") == 1
    assert sorted(f for f, _, _ in idx.items())[0] == "/".join(["+"] * (DEEP - 1)) + "/#"
    assert {k for _, k, _ in idx.items()} == {"exact", "plus", "plus-hash", "hash", "too-deep"}
    for f, k in [(deep_topic, "exact"), ("/".join(["+"] * DEEP), "plus"), ("l0/#", "hash"),
                 ("/".join(["+"] * (DEEP - 1)) + "/#", "plus-hash"), ("/".join(["+"] * (DEEP + 1)), "too-deep")]:
        assert idx.remove(f, k)
    assert idx.match(deep_topic) == [] and idx._root.children == {}


def test_match_keeps_depth_first_order_exact_before_plus():
    """Callers see the same order as the recursive walk had: '#' of a level, then the exact
    branch in full, then the '+' branch."""
    idx: TopicIndex[str, int] = TopicIndex()
    for k, f in enumerate(["+/+/c", "a/+/c", "a/b/c", "#", "a/#", "+/b/#", "a/b/#", "+/+/+"]):
        idx.add(f, f, k)
    assert [k for k, _ in idx.match("a/b/c")] == ["#", "a/#", "a/b/#", "a/b/c", "a/+/c", "+/b/#", "+/+/c", "+/+/+"]


def test_deep_topics_in_the_retained_store_do_not_recurse():
    deep_topic = "/".join(f"l{i}" for i in range(DEEP))
    store = RetainedStore()
    store.set(Message(deep_topic, b"deep", retain=True))
    store.set(Message("l0", b"top", retain=True))
    assert store.get(deep_topic) is not None and len(store) == 2
    assert [m.payload for m in store.match(deep_topic)] == [b"deep"]
    assert [m.payload for m in store.match("/".join(["+"] * DEEP))] == [b"deep"]
    assert [m.payload for m in store.match("/".join(["+"] * (DEEP - 1)) + "/#")] == [b"deep"]
    assert sorted(m.payload for m in store.match("l0/#")) == [b"deep", b"top"]
    assert sorted(m.payload for m in store) == [b"deep", b"top"]
    store.set(Message(deep_topic, b"", retain=True))  # an empty payload clears it
    assert len(store) == 1 and store.match("l0/#")[0].payload == b"top"
    assert store._root.children["l0"].children == {}


deep_levels = st.sampled_from(["a", "b", "", "$x"])


@st.composite
def deep_cases(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A topic of more than 3,000 levels (hypothesis raises the recursion limit by 2,000 while it
    runs a test) and filters derived from it: cut to a prefix (or one level deeper), some or all
    levels swapped for '+', one level changed, '#' appended."""
    unit = draw(st.lists(deep_levels, min_size=1, max_size=5))
    t_levels = unit * (3000 // len(unit) + draw(st.integers(1, 100)))
    n = len(t_levels)
    fs = []
    for _ in range(6):
        cut = draw(st.sampled_from([n - 1, n, n + 1]) | st.integers(1, n + 1))
        f_levels = t_levels[:cut] + (["a"] if cut > n else [])
        kind = draw(st.sampled_from(["exact", "some+", "all+"]))
        if kind == "all+":
            f_levels = ["+"] * len(f_levels)
        elif kind == "some+":
            for pos in draw(st.lists(st.integers(0, len(f_levels) - 1), max_size=5)):
                f_levels[pos] = "+"
        if draw(st.booleans()):
            f_levels[draw(st.integers(0, len(f_levels) - 1))] = draw(deep_levels)
        f = "/".join(f_levels)
        fs.append(f + "/#" if draw(st.booleans()) else f)
    fs.append(draw(filters))
    return "/".join(t_levels), fs


@settings(max_examples=60, deadline=None)
@given(deep_cases())
def test_deep_trie_and_retained_agree_with_the_reference(case):
    topic, fs = case
    idx: TopicIndex[int, str] = TopicIndex()
    for i, f in enumerate(fs):
        idx.add(f, i, f)
    got = sorted(k for k, _ in idx.match(topic))
    assert got == sorted(i for i, f in enumerate(fs) if filter_matches(f, topic))
    store = RetainedStore()
    store.set(Message(topic, b"v", retain=True))
    for f in fs:
        assert bool(store.match(f)) == filter_matches(f, topic)


def test_retained_set_here_after_a_mark_is_left_out_of_a_match_since_it():
    """What a publish on this router retains after a subscription went live reached it live: a
    match with ``live_after`` leaves it out, whatever the filter's shape ('#', '+', exact). A
    peer's update or a restored message is not delivered live here, so it always counts."""
    store = RetainedStore()
    store.set(Message("a/old", b"1", retain=True), local=True)
    store.set(Message("a/peer", b"2", retain=True))
    mark = store.seq
    store.set(Message("a/new", b"3", retain=True), local=True)
    store.set(Message("a/peer2", b"4", retain=True))
    for f in ("a/#", "a/+", "#"):
        assert sorted(m.topic for m in store.match(f, mark)) == ["a/old", "a/peer", "a/peer2"], f
        assert sorted(m.topic for m in store.match(f)) == ["a/new", "a/old", "a/peer", "a/peer2"], f
    assert store.match("a/new", mark) == [] and [m.payload for m in store.match("a/new")] == [b"3"]
    store.set(Message("a/old", b"5", retain=True), local=True)  # replaced here after the mark
    assert store.match("a/old", mark) == []


def test_a_topic_longer_than_the_cache_takes_is_matched_each_time_and_not_held():
    """A topic may have 65,535 bytes: one past ``CACHED_TOPIC_MAX`` characters is matched every
    time and not kept, so distinct long topics cannot fill the cache; a short one is kept."""
    idx: TopicIndex[str, int] = TopicIndex()
    idx.add("a/#", "x", 1)
    long_topic = "a/" + "l" * CACHED_TOPIC_MAX
    for _ in range(2):
        assert idx.match(long_topic) == [("x", 1)]
    assert long_topic not in idx._cache
    assert idx.match("a/b") == [("x", 1)] and "a/b" in idx._cache


def test_the_clears_remembered_are_bounded_by_their_topics_characters():
    """A clear is always allowed and counts against no quota: its tombstone (which orders a late
    update) is kept for at most ``TOMBSTONE_CHARS`` characters of topics, the oldest forgotten
    first, while the latest still orders a late update."""
    store = RetainedStore()
    length = 60_000
    n = TOMBSTONE_CHARS // length + 10
    for i in range(n):
        store.set(Message(f"{i:08d}/" + "c" * length, b"", retain=True), local=True)
    assert store.cleared_chars <= TOMBSTONE_CHARS
    assert store.cleared_chars == sum(len(t) for t in store.cleared)
    assert len(store.cleared) < n
    last = f"{n - 1:08d}/" + "c" * length
    assert store.current_version(last) is not None
    assert store.current_version(f"{0:08d}/" + "c" * length) is None  # the oldest forgotten
    # Clearing a topic again moves it, without counting its characters twice.
    before = store.cleared_chars
    store.set(Message(last, b"", retain=True), local=True)
    assert store.cleared_chars == before
