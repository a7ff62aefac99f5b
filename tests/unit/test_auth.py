"""router.auth: Mosquitto's password and ACL files, and the checks made with them."""

from __future__ import annotations

import hashlib
import inspect
import shutil
import subprocess
import time

import pytest

from brokerd.connection.reasons import Reason
from brokerd.router.auth import (
    Acl,
    Auth,
    AuthFileError,
    filter_covers,
    filters_overlap,
    hash_password,
    parse_password_file,
    read_password_file,
    set_password,
    verify_password,
)


def test_hash_round_trip_and_format() -> None:
    h = hash_password("s3cret")
    assert h.startswith("$7$101$")
    assert verify_password(h, b"s3cret")
    assert not verify_password(h, b"wrong")
    assert not verify_password("$9$x$y", b"s3cret")


def test_sha512_6_entries_are_read() -> None:
    import base64
    import hashlib

    salt = b"0123456789ab"
    h = f"$6${base64.b64encode(salt).decode()}${base64.b64encode(hashlib.sha512(b'pw' + salt).digest()).decode()}"
    assert verify_password(h, b"pw") and not verify_password(h, b"px")


def test_plain_text_password_refused() -> None:
    with pytest.raises(AuthFileError, match="line 2"):
        parse_password_file("# c\nbob:plaintext\n")


def test_set_password_creates_and_updates(tmp_path) -> None:
    path = str(tmp_path / "pw")
    assert set_password(path, "alice", "one")
    assert set_password(path, "bob", "two")
    assert not set_password(path, "alice", "three")
    users = read_password_file(path)
    assert set(users) == {"alice", "bob"}
    assert verify_password(users["alice"], b"three")
    assert "three" not in open(path).read()
    assert (tmp_path / "pw").stat().st_mode & 0o777 == 0o600


@pytest.mark.skipif(shutil.which("mosquitto_passwd") is None, reason="mosquitto_passwd not installed")
def test_mosquitto_passwd_file_is_accepted(tmp_path) -> None:
    path = tmp_path / "pw"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(path), "carol", "pa55"], check=True)
    users = read_password_file(str(path))
    assert verify_password(users["carol"], b"pa55")
    assert not verify_password(users["carol"], b"pa56")


ACL = """
# anonymous
topic read public/#

user alice
topic readwrite alice/#
topic read sensors/+/temp
topic deny sensors/secret/temp

user bob
topic write cmd/#

pattern readwrite clients/%c/#
pattern read users/%u/inbox
"""


def _auth() -> Auth:
    return Auth(None, Acl.parse(ACL), None, True)


def test_acl_user_topics_and_deny() -> None:
    a = _auth()
    assert a.may_publish("alice", "c1", "alice/x")
    assert a.may_read("alice", "c1", "sensors/kitchen/temp")
    assert not a.may_read("alice", "c1", "sensors/secret/temp")
    assert not a.may_publish("alice", "c1", "sensors/kitchen/temp")
    assert a.may_publish("bob", "c2", "cmd/a/b") and not a.may_read("bob", "c2", "cmd/a/b")
    assert a.may_read(None, "c3", "public/news") and not a.may_read(None, "c3", "alice/x")
    assert not a.may_publish("alice", "c1", "$SYS/broker/x")


def test_acl_patterns() -> None:
    a = _auth()
    assert a.may_publish("bob", "dev7", "clients/dev7/status")
    assert not a.may_publish("bob", "dev7", "clients/dev8/status")
    assert a.may_read("alice", "x", "users/alice/inbox") and not a.may_read("bob", "x", "users/alice/inbox")
    assert not a.may_publish(None, "a+b", "clients/a+b/x")  # a wildcard in an id never widens a pattern


def test_acl_subscribe() -> None:
    a = _auth()
    assert a.may_subscribe("alice", "c", "sensors/kitchen/temp", False)
    assert not a.may_subscribe("alice", "c", "sensors/secret/temp", False)
    assert a.may_subscribe("alice", "c", "sensors/#", False)  # overlaps a grant: deliveries are filtered
    assert not a.may_subscribe("alice", "c", "other/#", False)
    assert not a.may_subscribe("alice", "c", "sensors/#", True)  # shared: must be covered
    assert a.may_subscribe("alice", "c", "alice/+", True)


def test_acl_syntax_errors() -> None:
    with pytest.raises(AuthFileError, match="line 1"):
        Acl.parse("topics read a")
    with pytest.raises(AuthFileError, match="line 2"):
        Acl.parse("user x\ntopic\n")


def test_filter_relations() -> None:
    assert filters_overlap("a/+/c", "a/b/#") and filters_overlap("a", "a/#")
    assert not filters_overlap("a/b", "a/c") and not filters_overlap("+/x", "$SYS/x")
    assert filter_covers("a/#", "a/+/c") and filter_covers("a/+", "a/b")
    assert not filter_covers("a/+", "a/#") and not filter_covers("a/b", "a/+")


def test_authenticate() -> None:
    pw = {"alice": hash_password("pw")}
    a = Auth(pw, None, None, False)
    assert a.authenticate("c", "alice", b"pw", None) is None
    assert a.authenticate("c", "alice", b"no", None) == Reason.BAD_USER_NAME_OR_PASSWORD
    assert a.authenticate("c", "mallory", b"pw", None) == Reason.BAD_USER_NAME_OR_PASSWORD
    assert a.authenticate("c", None, None, None) == Reason.NOT_AUTHORIZED
    assert Auth(pw, None, None, True).authenticate("c", None, None, None) is None


def test_plugin_decides_unknown_users() -> None:
    class Plugin:
        def authenticate(self, client_id, username, password, peer):
            return password == b"ok"

        def authorize(self, client_id, username, topic, access):
            return False if topic.startswith("forbidden/") else None

    a = Auth({"alice": hash_password("pw")}, None, Plugin(), False)
    assert a.authenticate("c", "zed", b"ok", None) is None
    assert a.authenticate("c", "zed", b"no", None) == Reason.BAD_USER_NAME_OR_PASSWORD
    assert a.authorizes and not a.may_publish("zed", "c", "forbidden/x") and a.may_publish("zed", "c", "ok/x")


@pytest.mark.parametrize("line", ["topic deny", "topic read", "topic readwrite  ", "pattern write"])
def test_an_access_word_without_a_filter_is_an_error_not_a_topic(line: str) -> None:
    """``topic deny`` alone once granted read and write on a topic named ``deny`` (Mosquitto refuses it)."""
    with pytest.raises(AuthFileError, match=r"^acl: line 3: (topic|pattern) needs a topic filter"):
        Acl.parse(f"user x\ntopic read a/#\n{line}\n", "acl")
    assert Acl.parse("topic deny a/b\n", "acl").anonymous == [(0, "a/b")]


def test_an_unknown_user_costs_the_hashing_a_wrong_password_does(monkeypatch) -> None:
    """No list of users by timing: an unknown user is checked against a decoy of the file's commonest
    iteration count, so both refusals run one PBKDF2 of the same cost."""
    import hashlib

    calls: list[int] = []
    real = hashlib.pbkdf2_hmac

    def counted(name: str, password: bytes, salt: bytes, iterations: int, *rest: object) -> bytes:
        calls.append(iterations)
        return real(name, password, salt, iterations, *rest)

    pw = {"alice": hash_password("pw", 2000), "bob": hash_password("pw2", 2000), "old": hash_password("x", 7)}
    a = Auth(pw, None, None, False)
    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counted)
    assert a.authenticate("c", "alice", b"wrong", None) == Reason.BAD_USER_NAME_OR_PASSWORD
    assert a.authenticate("c", "mallory", b"wrong", None) == Reason.BAD_USER_NAME_OR_PASSWORD
    assert a.authenticate("c", "mallory", None, None) == Reason.BAD_USER_NAME_OR_PASSWORD
    assert a.authenticate("c", "alice", None, None) == Reason.BAD_USER_NAME_OR_PASSWORD
    assert calls == [2000, 2000, 2000, 2000]


def test_a_user_name_nothing_verifies_makes_no_one_in_where_anonymous_clients_are_refused() -> None:
    """Without a password file or plugin a user name is a claim: it gets in only where an anonymous
    client would, on the node and on the client's listener; a certificate's name is verified."""
    acl = Acl.parse("user admin\ntopic readwrite #\n")
    refused = Auth(None, acl, None, False)
    assert not refused.checks_passwords
    assert refused.authenticate("c", "admin", None, None) == Reason.NOT_AUTHORIZED
    assert refused.authenticate("c", "admin", b"anything", None) == Reason.NOT_AUTHORIZED
    assert refused.authenticate("c", "device-7", None, None, certified=True) is None
    allowed = Auth(None, acl, None, True)
    assert allowed.authenticate("c", "admin", None, None, anonymous=False) == Reason.NOT_AUTHORIZED
    assert allowed.authenticate("c", None, None, None) is None
    # With a password file the certificate is still the authentication (as Mosquitto): not the file.
    assert Auth({"alice": hash_password("pw")}, None, None, False).authenticate(
        "c", "device-7", None, None, certified=True) is None


@pytest.mark.parametrize(("status", "body", "meaning"), [
    (200, b"", True), (204, b"", True), (200, b'{"result": "allow"}', True), (200, b'{"result": "deny"}', False),
    (200, b'{"result": "ignore"}', None), (200, b"<html>OK</html>", "failure"), (200, b"{}", "failure"),
    (200, b'["allow"]', "failure"), (200, b'{"result": "yes"}', "failure"), (202, b"", "failure"),
])
def test_http_auth_reads_only_the_documented_answers(status: int, body: bytes, meaning: object) -> None:
    """An answer nobody documented is a failure (the client refused, nothing cached), never an allow."""
    from brokerd.cluster.auth_http import HttpAuth

    plugin = HttpAuth({"url": "http://127.0.0.1:9/auth"})
    if meaning == "failure":
        with pytest.raises(RuntimeError, match="auth service http://127.0.0.1:9/auth"):
            plugin._meaning(status, body)
    else:
        assert plugin._meaning(status, body) is meaning


def test_start_up_names_each_listener_where_every_client_is_refused() -> None:
    """One line per listener: where anonymous clients are refused and nothing checks a password,
    nobody gets in, and the line says so and what to do."""
    from brokerd.cluster.auth_setup import anonymous_allowed
    from brokerd.cluster.config import load
    from brokerd.cluster.listeners import describe

    def lines(*argv: str) -> list[str]:
        c = load(list(argv), {})
        return describe(c.listeners, c.listeners_implicit, bool(c.password_file or c.auth_plugin),
                        anonymous_allowed(c))

    shut = "every client refused: anonymous clients are not allowed here and no password file"
    assert shut in lines("--listen", "0.0.0.0:1883")[0]
    assert shut in lines("--allow-anonymous", "off")[0]
    assert "anonymous clients allowed (loopback); user names are not checked" in lines("--port", "1883")[0]
    assert lines("--password-file", "pw")[0].endswith("anonymous clients refused (the node authenticates its clients)")
    assert "refused" not in lines("--listen", "0.0.0.0:1883", "--allow-anonymous", "on")[0]


def test_http_auths_cached_answer_is_for_the_address_it_was_given_to() -> None:
    """The service is told the client's address and may decide by it: an answer cached for one
    address is not given to the same client id, user and password from another (the port, new at
    each connection, does not count)."""
    from brokerd.cluster.auth_http import HttpAuth

    plugin = HttpAuth({"url": "http://127.0.0.1:9/auth"})
    key = ("c", "alice", "127.0.0.2", hashlib.sha256(b"pw").digest())
    plugin._cache[key] = (time.monotonic() + 60, True)
    assert plugin.authenticate("c", "alice", b"pw", "127.0.0.2:50001") is True  # another port: cached
    asked = plugin.authenticate("c", "alice", b"pw", "127.0.0.3:50001")
    assert asked is not True and inspect.isawaitable(asked)  # another address: the service is asked
    asked.close()  # (not awaited: no service here)
