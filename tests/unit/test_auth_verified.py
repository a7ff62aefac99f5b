"""router.auth: a (user, password) pair the password file verified is not hashed again.

PBKDF2 at mosquitto_passwd's 101 iterations costs more than the rest of a connect; a fleet
reconnects with the same pairs. What is kept is a keyed hash of the pair, never the password,
and a wrong password pays the full hashing every time."""

from __future__ import annotations

import hashlib

import pytest

from brokerd.connection.reasons import Reason
from brokerd.router.auth import VERIFIED_MAX, Auth, hash_password


@pytest.fixture
def hashings(monkeypatch) -> list[bytes]:
    """The passwords PBKDF2 ran on, in order."""
    calls: list[bytes] = []
    real = hashlib.pbkdf2_hmac

    def counted(name: str, password: bytes, salt: bytes, iterations: int, *rest: object) -> bytes:
        calls.append(password)
        return real(name, password, salt, iterations, *rest)

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counted)
    return calls


def test_a_verified_pair_is_not_hashed_again_and_a_wrong_password_always_is(hashings: list[bytes]) -> None:
    a = Auth({"alice": hash_password("pw"), "bob": hash_password("pw2")}, None, None, False)
    hashings.clear()
    assert a.authenticate("c1", "alice", b"pw", None) is None
    assert a.authenticate("c2", "alice", b"pw", None) is None
    assert hashings == [b"pw"]
    for _ in range(3):
        assert a.authenticate("c1", "alice", b"wrong", None) == Reason.BAD_USER_NAME_OR_PASSWORD
    assert a.authenticate("c1", "alice", None, None) == Reason.BAD_USER_NAME_OR_PASSWORD
    assert hashings == [b"pw", b"wrong", b"wrong", b"wrong", b""]
    # Another user with alice's password, and alice's password under bob's name: each checked.
    assert a.authenticate("c3", "bob", b"pw", None) == Reason.BAD_USER_NAME_OR_PASSWORD
    assert a.authenticate("c3", "bob", b"pw2", None) is None
    assert a.authenticate("c3", "bob", b"pw2", None) is None
    assert hashings[5:] == [b"pw", b"pw2"]


def test_what_is_kept_is_a_keyed_hash_not_the_password() -> None:
    a = Auth({"alice": hash_password("secret-pw")}, None, None, False)
    assert a.authenticate("c", "alice", b"secret-pw", None) is None
    kept = list(a._verified)
    assert len(kept) == 1 and len(kept[0]) == 32 and b"secret-pw" not in kept[0]
    b = Auth(a.passwords, None, None, False)  # another Auth (another process) keys it differently
    assert b.authenticate("c", "alice", b"secret-pw", None) is None
    assert list(b._verified) != kept


def test_a_changed_entry_is_checked_anew(hashings: list[bytes]) -> None:
    a = Auth({"alice": hash_password("old")}, None, None, False)
    assert a.authenticate("c", "alice", b"old", None) is None
    assert a.passwords is not None
    a.passwords["alice"] = hash_password("new")
    hashings.clear()
    assert a.authenticate("c", "alice", b"old", None) == Reason.BAD_USER_NAME_OR_PASSWORD
    assert a.authenticate("c", "alice", b"new", None) is None
    assert hashings == [b"old", b"new"]


def test_the_kept_pairs_are_bounded_the_oldest_going_first(hashings: list[bytes]) -> None:
    users = {f"u{i}": hash_password("pw", 1) for i in range(VERIFIED_MAX + 1)}
    a = Auth(users, None, None, False)
    for i in range(VERIFIED_MAX + 1):
        assert a.authenticate("c", f"u{i}", b"pw", None) is None
    assert len(a._verified) == VERIFIED_MAX
    hashings.clear()
    assert a.authenticate("c", f"u{VERIFIED_MAX}", b"pw", None) is None  # the newest: kept
    assert hashings == []
    assert a.authenticate("c", "u0", b"pw", None) is None  # the oldest: gone, hashed again
    assert hashings == [b"pw"]
