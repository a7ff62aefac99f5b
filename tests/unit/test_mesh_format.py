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


def test_session_frames_of_version_10():
    """Sessions replicated with the log (cluster.replication): well-formed bodies pass, and a
    lying or buggy peer's are refused by name."""
    from brokerd.router.mesh_format import SESSION_CATCHUP, SESSION_COPIES, SESSION_GONE, SESSION_STATE

    assert check_body(SESSION_STATE, ["a/w0", True, {"c1": {"subs": []}, "c2": None}]) is None
    assert check_body(SESSION_GONE, ["a/w0", ["c1", "c2"]]) is None
    assert check_body(SESSION_CATCHUP, ["c1", "b/w0", -1, 1700000000000, [["t/#", 1]], None]) is None
    assert check_body(SESSION_COPIES, ["c1", [[1, False, ["t", b"x"]]], True]) is None
    for kind, bad, name in [
        (SESSION_STATE, ["a/w0", True, {"c1": "subs"}], "session-state"),
        (SESSION_STATE, ["a/w0", {}, True], "session-state"),
        (SESSION_GONE, ["a/w0", [1]], "session-gone"),
        (SESSION_CATCHUP, ["c1", "b/w0", "0", 0, [], None], "session-catch-up"),
        (SESSION_CATCHUP, ["c1", "b/w0", 0, 0, [], 7], "session-catch-up"),
        (SESSION_COPIES, ["c1", [[1, False]], True], "session-copies"),
    ]:
        assert check_body(kind, bad) == f"malformed {name} body"


def test_session_restore_frames():
    """A router back on an empty disk asks a follower for its sessions; each comes back with
    the keys of a takeover header, and a last frame without one ends the answer."""
    from brokerd.router.mesh_format import SESSION_KEYS, SESSION_RESTORE, SESSION_RESTORED

    header = {k: [] for k in SESSION_KEYS}
    assert check_body(SESSION_RESTORE, "a/w0") is None
    assert check_body(SESSION_RESTORED, ["a/w0", header, False]) is None
    assert check_body(SESSION_RESTORED, ["a/w0", None, True]) is None
    assert check_body(SESSION_RESTORE, ["a/w0"]) == "malformed session-restore body"
    assert check_body(SESSION_RESTORED, ["a/w0", {"client_id": "c"}, False]) == "malformed session-restored body"


def test_session_hand_on_frames_of_version_18():
    """The last SESSION_HANDON may name the routers its old router had not heard (a dict), and a
    fenced copy's hand-on says so (a fifth value, true) on every frame: a receiver that took them
    for malformed dropped the end of the hand-on and its copies."""
    from brokerd.router.mesh_format import SESSION_HANDON

    item = [1, False, ["t", b"p", 1, False, "c", "a/w0", 7, 1, None]]
    assert check_body(SESSION_HANDON, ["cid", [item], True]) is None
    assert check_body(SESSION_HANDON, ["cid", [item], True, {"b/w0": 12}]) is None
    assert check_body(SESSION_HANDON, ["cid", [item], False, None, True]) is None
    assert check_body(SESSION_HANDON, ["cid", [item], True, {"b/w0": 12}, True]) is None
    assert check_body(SESSION_HANDON, ["cid", [item], True, [1], True]) is not None
    assert check_body(SESSION_HANDON, ["cid", [item], True, None, "yes"]) is not None
    assert check_body(SESSION_HANDON, ["cid", [item], True, None, True, 0]) is not None
