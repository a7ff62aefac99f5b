"""Topic filters and the trie, against the examples of the MQTT 3.1.1 spec (4.7) and a reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.message import Message
from router.retained import RetainedStore
from router.topics import TopicIndex, filter_matches, valid_topic_filter, valid_topic_name

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
