"""The topic-filter regex the data source evaluates in Arrow must agree with the broker's matcher."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.pipeline.topics import TopicFilterError, filter_regex, python_regex, wildcard_levels
from brokerd.router.topics import filter_matches, valid_topic_filter

LEVELS = st.sampled_from(["a", "b", "", "$SYS", "x.y", "(", "é", "a b", "*", "\\", "\n"])
TOPICS = st.lists(LEVELS, min_size=1, max_size=4).map("/".join).filter(bool)
FILTERS = st.lists(st.one_of(LEVELS, st.just("+"), st.just("#")), min_size=1, max_size=4).map("/".join).filter(
    valid_topic_filter)


@settings(max_examples=400, deadline=None)
@given(FILTERS, st.lists(TOPICS, min_size=1, max_size=8))
def test_regex_agrees_with_the_broker_matcher(topic_filter, topics):
    pattern = filter_regex(topic_filter)
    want = [filter_matches(topic_filter, t) for t in topics]
    assert [re.search(python_regex(pattern), t) is not None for t in topics] == want
    pa = pytest.importorskip("pyarrow")
    import pyarrow.compute as pc

    assert pc.match_substring_regex(pa.array(topics), pattern).to_pylist() == want


@pytest.mark.parametrize("topic_filter,topic", [("+/", "a/\n"), ("a/b", "a/b\n"), ("a/+", "a/b\n/c")])
def test_a_final_newline_is_part_of_the_topic(topic_filter, topic):
    assert not filter_matches(topic_filter, topic)
    assert re.search(python_regex(filter_regex(topic_filter)), topic) is None
    pa = pytest.importorskip("pyarrow")
    import pyarrow.compute as pc

    assert pc.match_substring_regex(pa.array([topic]), filter_regex(topic_filter)).to_pylist() == [False]


def test_invalid_filters_are_refused():
    for bad in ("a/#/b", "a+", "#a", ""):
        with pytest.raises(TopicFilterError):
            filter_regex(bad)


def test_wildcard_levels():
    assert wildcard_levels("devices/+/telemetry") == [1]
    assert wildcard_levels("+/x/+/#") == [0, 2]
    assert wildcard_levels("a/b") == []
