"""The shapes of the mesh frames that carry marks and catch-up requests (version 8): a peer of
another build, or a lying one, costs a dropped frame, never an exception."""

from __future__ import annotations

import pytest

from brokerd.router.mesh_format import CATCHUP, HELLO, PUBLISH, check_body


@pytest.mark.parametrize("body", [[1, [], 0], [7, [["x"]], -1], [2, [], 123456789]])
def test_a_publish_frame_carries_its_mark(body):
    assert check_body(PUBLISH, body) is None


@pytest.mark.parametrize("body", [[1, []], [1, [], None], [1, [], "3"], [1, [], 0, 0]])
def test_a_publish_frame_without_an_integer_mark_is_refused(body):
    assert check_body(PUBLISH, body) == "malformed publish body"


def test_catch_up_asks_from_an_offset():
    assert check_body(CATCHUP, 0) is None
    assert check_body(CATCHUP, 42) is None
    for bad in (-1, None, "5", [5]):
        assert check_body(CATCHUP, bad) == "malformed catch-up body"


def test_hello_may_name_its_log_offset():
    assert check_body(HELLO, {"node": "a", "log": 10}) is None
    assert check_body(HELLO, {"node": "a"}) is None
    assert check_body(HELLO, {"node": "a", "log": "10"}) == "malformed hello body"
