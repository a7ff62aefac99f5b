"""Who may connect, and what they may do: password file, ACL file, auth plugins (sans-IO).

Files are Mosquitto's, so an operator brings the ones they have:

* password file (``mosquitto_passwd``): ``user:$7$<iterations>$<base64 salt>$<base64 hash>``, the
  hash PBKDF2-HMAC-SHA512 of the password; ``$6$<salt>$<hash>`` (SHA-512 of password + salt) is
  read too. ``hash_password`` writes ``$7$`` entries (101 iterations, 12-byte salt, as Mosquitto).
* ACL file (``acl_file``): ``user NAME``, ``topic [read|write|readwrite|deny] FILTER`` (for the
  last ``user``; before any, for anonymous clients), ``pattern [...] FILTER`` for every client with
  ``%c`` (client id) and ``%u`` (user name) substituted. A ``deny`` that matches wins; otherwise
  access needs an entry granting it. An access word without a filter (``topic deny``) is an error.

A user name counts only where something verifies it: the password file (an unknown user costs the
same hashing as a wrong password), a plugin, or the client certificate of a ``use_identity_as_username``
listener. Without any, the client is anonymous, and refused where anonymous clients are.

``Auth`` is what a router consults: ``router.auth`` (CONNECT) is None when nothing is configured,
and ``router.acl`` (SUBSCRIBE, PUBLISH, delivery) is None unless an ACL file or a plugin's
``authorize`` is: the paths of a broker without them test one attribute.

A plugin is any object with ``authenticate(client_id, username, password, peer)`` returning True,
False or None (no opinion), or an awaitable of one, and optionally ``authorize(client_id,
username, topic, access)`` (access ``"read"``, ``"write"`` or ``"subscribe"``; a filter for
subscribe) returning True, False or None, synchronously (it is asked on the message path). Its
answers are kept per (user, client, topic, access), and the routes folded with them per topic,
until the next reload (SIGHUP): a plugin that revokes a grant has the broker reloaded.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
import os
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from brokerd.connection.reasons import Reason

from .topics import filter_matches

if TYPE_CHECKING:
    from .session import Session

READ, WRITE = 1, 2
_ACCESS = {"read": READ, "write": WRITE, "readwrite": READ | WRITE, "deny": 0}
ITERATIONS = 101  # mosquitto_passwd's default
SALT_BYTES = 12
CACHE_MAX = 4096  # ACL answers kept per Auth (client, topic, access); cleared when full
# ... or when their topics hold this many characters: a topic may have 65,535 bytes, and 4096
# answers on distinct long topics (each publish refused) held 268 MB of them.
CACHE_TOPIC_CHARS = 4 << 20
VERIFIED_MAX = 16384  # (user, password) pairs a password file verified, kept per Auth; the oldest goes first


class AuthFileError(Exception):
    """A password or ACL file that cannot be used: the message names file and line."""


# -- passwords --------------------------------------------------------------------------------------

def hash_password(password: str, iterations: int = ITERATIONS, salt: bytes | None = None) -> str:
    """A ``$7$`` entry's hash part for ``password`` (PBKDF2-HMAC-SHA512, as mosquitto_passwd)."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_password(stored: str, password: bytes) -> bool:
    """Whether ``password`` matches a stored ``$7$`` or ``$6$`` hash (constant-time compare)."""
    parts = stored.split("$")
    try:
        if len(parts) == 5 and parts[1] == "7":
            iterations, salt, want = int(parts[2]), base64.b64decode(parts[3]), base64.b64decode(parts[4])
            got = hashlib.pbkdf2_hmac("sha512", password, salt, iterations)
        elif len(parts) == 4 and parts[1] == "6":
            salt, want = base64.b64decode(parts[2]), base64.b64decode(parts[3])
            got = hashlib.sha512(password + salt).digest()
        else:
            return False
    except ValueError:
        return False
    return hmac.compare_digest(got, want)


def _valid_hash(stored: str) -> bool:
    parts = stored.split("$")
    if len(parts) == 5 and parts[1] == "7":
        if not parts[2].isdigit() or int(parts[2]) < 1:
            return False
        b64 = parts[3:]
    elif len(parts) == 4 and parts[1] == "6":
        b64 = parts[2:]
    else:
        return False
    try:
        return all(base64.b64decode(p, validate=True) for p in b64)
    except ValueError:
        return False


def parse_password_file(text: str, name: str = "password file") -> dict[str, str]:
    """``user:hash`` lines → {user: hash}. Blank lines and ``#`` comments are skipped; a line
    without a ``$6$``/``$7$`` hash (a plain-text password) is an error."""
    users: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, stored = line.partition(":")
        if not sep or not user:
            raise AuthFileError(f"{name}: line {n}: expected USER:HASH")
        if not _valid_hash(stored):
            raise AuthFileError(f"{name}: line {n}: user {user!r} has no $7$ or $6$ password hash "
                                "(plain-text passwords are not accepted; use `brokerd passwd`)")
        users[user] = stored
    return users


def read_password_file(path: str) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as f:
            return parse_password_file(f.read(), path)
    except OSError as exc:
        raise AuthFileError(f"{path}: {exc.strerror}") from None


def set_password(path: str, user: str, password: str) -> bool:
    """Create or update ``user``'s entry in the password file at ``path`` (written whole, then
    renamed into place, mode 0600 for a new file). Returns True when the user was new."""
    if not user or ":" in user:
        raise AuthFileError("a user name must be non-empty and without ':'")
    lines: list[str] = []
    mode = 0o600
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        parse_password_file(text, path)  # never rewrite a file we cannot read back
        lines = text.splitlines()
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise AuthFileError(f"{path}: {exc.strerror}") from None
    entry = f"{user}:{hash_password(password)}"
    new = True
    for i, line in enumerate(lines):
        if line.strip().partition(":")[0] == user and not line.lstrip().startswith("#"):
            lines[i] = entry
            new = False
            break
    else:
        lines.append(entry)
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return new


# -- ACL ----------------------------------------------------------------------------------------------

def _wild(topic_filter: str) -> bool:
    return "+" in topic_filter or "#" in topic_filter


def filters_overlap(a: str, b: str) -> bool:
    """Whether some topic matches both filters."""
    if (a[:1] == "$") != (b[:1] == "$") and (a[:1] in "+#" or b[:1] in "+#"):
        return False
    la, lb = a.split("/"), b.split("/")
    for x, y in zip(la, lb, strict=False):
        if x == "#" or y == "#":
            return True
        if x != y and x != "+" and y != "+":
            return False
    rest = la[len(lb):] or lb[len(la):]
    return not rest or rest == ["#"]


def filter_covers(a: str, b: str) -> bool:
    """Whether every topic filter ``b`` matches is matched by filter ``a``."""
    if b[:1] == "$" and a[:1] in ("+", "#"):
        return False
    la, lb = a.split("/"), b.split("/")
    for i, x in enumerate(la):
        if x == "#":
            return True
        if i >= len(lb):
            return False
        y = lb[i]
        if y == "#" or (x != "+" and (y == "+" or x != y)):
            return False
    return len(la) == len(lb)


class Acl:
    """A parsed ACL file. ``rules(username, client_id)`` are the (access, filter) entries that
    apply to one client: its user's (or the anonymous ones) and the patterns, substituted."""

    def __init__(self, anonymous: list, users: dict[str, list], patterns: list) -> None:
        self.anonymous = anonymous
        self.users = users
        self.patterns = patterns

    @classmethod
    def parse(cls, text: str, name: str = "ACL file") -> Acl:
        anonymous: list[tuple[int, str]] = []
        users: dict[str, list[tuple[int, str]]] = {}
        patterns: list[tuple[int, str]] = []
        current = anonymous
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            word, _, rest = line.partition(" ")
            rest = rest.strip()
            if word == "user":
                if not rest:
                    raise AuthFileError(f"{name}: line {n}: user needs a name")
                current = users.setdefault(rest, [])
                continue
            if word not in ("topic", "pattern"):
                raise AuthFileError(f"{name}: line {n}: unknown keyword {word!r} (user, topic or pattern)")
            access = READ | WRITE
            first, _, after = rest.partition(" ")
            if first in _ACCESS:  # ``topic deny`` alone is an error, never a grant on a topic named deny
                access, rest = _ACCESS[first], after.strip()
            if not rest:
                raise AuthFileError(f"{name}: line {n}: {word} needs a topic filter")
            (patterns if word == "pattern" else current).append((access, rest))
        return cls(anonymous, users, patterns)

    def rules(self, username: str | None, client_id: str) -> list[tuple[int, str]]:
        own = self.anonymous if username is None else self.users.get(username, [])
        out = list(own)
        for access, f in self.patterns:
            has_u, has_c = "%u" in f, "%c" in f
            if has_u and (username is None or not _safe(username)):
                continue
            if has_c and not _safe(client_id):
                continue
            if has_u or has_c:
                f = _substitute(f, username or "", client_id)
            out.append((access, f))
        return out


def _substitute(pattern: str, username: str, client_id: str) -> str:
    """``%u`` and ``%c`` replaced in one pass over the pattern, as Mosquitto reads it: replaced one
    after the other, a user named ``%c`` had its name replaced by its client id, which it chooses
    (``users/%u/#`` became ``users/bob/#`` for a client calling itself bob)."""
    parts = pattern.split("%u")
    return username.join(part.replace("%c", client_id) for part in parts)


def _safe(value: str) -> bool:
    """A user name or client id substituted into a pattern must not widen it (as Mosquitto)."""
    return bool(value) and not any(c in value for c in "+#/")


def check_rules(rules: list[tuple[int, str]], topic: str, access: int) -> bool:
    """A topic against one client's rules: a matching deny wins, else a matching grant allows."""
    allowed = False
    for granted, f in rules:
        if filter_matches(f, topic):
            if granted == 0:
                return False
            if granted & access:
                allowed = True
    return allowed


def check_subscribe(rules: list[tuple[int, str]], topic_filter: str, shared: bool) -> bool:
    """A subscription filter: exact for a plain one; a wildcard filter needs a read grant that
    overlaps it and no deny covering it (each delivery is checked too), or, for a shared
    subscription (whose deliveries are not), a read grant covering it and no deny overlapping it."""
    if not _wild(topic_filter):
        return check_rules(rules, topic_filter, READ)
    if shared:
        return (any(g & READ and filter_covers(f, topic_filter) for g, f in rules)
                and not any(g == 0 and filters_overlap(f, topic_filter) for g, f in rules))
    if any(g == 0 and filter_covers(f, topic_filter) for g, f in rules):
        return False
    return any(g & READ and filters_overlap(f, topic_filter) for g, f in rules)


def read_acl_file(path: str) -> Acl:
    try:
        with open(path, encoding="utf-8") as f:
            return Acl.parse(f.read(), path)
    except OSError as exc:
        raise AuthFileError(f"{path}: {exc.strerror}") from None


# -- what a router consults ---------------------------------------------------------------------------

OK = None  # authenticate's answer for an accepted client


def _decoy(passwords: dict[str, str]) -> str:
    """A hash no password matches, of the file's commonest kind and iteration count: verified for
    an unknown user, so that it costs what a known user's wrong password does (no user list by timing)."""
    kinds: dict[str, int] = {}
    for stored in passwords.values():
        parts = stored.split("$")
        kind = parts[2] if len(parts) == 5 and parts[1] == "7" else "6"
        kinds[kind] = kinds.get(kind, 0) + 1
    common = max(kinds, key=kinds.__getitem__, default=str(ITERATIONS))
    salt, digest = (base64.b64encode(os.urandom(n)).decode() for n in (SALT_BYTES, 64))
    return f"$6${salt}${digest}" if common == "6" else f"$7${common}${salt}${digest}"


class Auth:
    """Authentication and authorization of one router's clients."""

    def __init__(self, passwords: dict[str, str] | None = None, acl: Acl | None = None,
                 plugin: Any = None, allow_anonymous: bool = False) -> None:
        self.passwords = passwords
        self._decoy = _decoy(passwords) if passwords is not None else ""
        self.acl = acl
        self.plugin = plugin
        self.allow_anonymous = allow_anonymous
        self._authorize = getattr(plugin, "authorize", None)
        self._rules: dict[tuple[str | None, str], list] = {}
        self._cache: dict[tuple, bool] = {}
        self._cache_chars = 0  # the topics' characters ``_cache`` holds (``CACHE_TOPIC_CHARS``)
        # Pairs the password file verified (``_verified``), by a keyed hash of this Auth's own
        # random key: never the password, and nothing an outsider can compute.
        self._pair_key = os.urandom(32)
        self._verified: dict[bytes, str] = {}

    @property
    def authorizes(self) -> bool:
        """Whether anything restricts topics (else ``router.acl`` stays None)."""
        return self.acl is not None or self._authorize is not None

    @property
    def authenticates(self) -> bool:
        return self.passwords is not None or self.plugin is not None or not self.allow_anonymous

    @property
    def checks_passwords(self) -> bool:
        """Whether anything can verify a user name (a password file or a plugin). Without either a
        user name is only a claim: its client is anonymous (``router.access.anonymous_check``)."""
        return self.passwords is not None or self.plugin is not None

    # CONNECT ------------------------------------------------------------------------------------------

    def authenticate(self, client_id: str, username: str | None, password: bytes | None, peer: Any, *,
                     anonymous: bool = True, certified: bool = False) -> Reason | None | Awaitable[Reason | None]:
        """None when the client may connect, else the reason to refuse it with; an awaitable of
        that when a plugin has to be asked. ``anonymous``: whether the client's listener allows
        anonymous clients (the node's rule applies too). ``certified``: the user name is the
        verified client certificate's, on a ``use_identity_as_username`` listener; the certificate
        is its authentication, and neither the password file nor a plugin is asked (as Mosquitto)."""
        if certified:
            return OK
        if username is None or not self.checks_passwords:
            return OK if anonymous and self.allow_anonymous else Reason.NOT_AUTHORIZED
        stored = self.passwords.get(username) if self.passwords is not None else None
        if stored is not None:
            if password is None:
                verify_password(stored, b"")  # the same work as a wrong password
                return Reason.BAD_USER_NAME_OR_PASSWORD
            return self._verified_pair(username, password, stored)
        if self.plugin is None:
            verify_password(self._decoy, b"" if password is None else password)  # the same work, in vain
            return Reason.BAD_USER_NAME_OR_PASSWORD
        answer = self.plugin.authenticate(client_id, username, password, peer)
        if inspect.isawaitable(answer):
            return _await_answer(answer)
        return _answer(answer)

    def _verified_pair(self, username: str, password: bytes, stored: str) -> Reason | None:
        """A known user's password checked against its stored hash, once per (user, password):
        PBKDF2 costs more than the rest of a connect (about 65 us at mosquitto_passwd's 101
        iterations), and a fleet reconnects with the same pairs. A pair that matched is kept as
        its keyed BLAKE2b under this Auth's random key (a MAC, as HMAC, at a third of HMAC-SHA256's
        cost), with the hash it matched, so a changed entry is checked anew; a wrong password is
        never kept and pays the full hashing every time."""
        name = username.encode()
        pair = hashlib.blake2b(len(name).to_bytes(4, "big") + name + password, key=self._pair_key,
                               digest_size=32).digest()
        verified = self._verified
        if verified.get(pair) == stored:
            return OK
        if not verify_password(stored, password):
            return Reason.BAD_USER_NAME_OR_PASSWORD
        if len(verified) >= VERIFIED_MAX:
            del verified[next(iter(verified))]
        verified[pair] = stored
        return OK

    # topics -------------------------------------------------------------------------------------------

    def _client_rules(self, username: str | None, client_id: str) -> list:
        key = (username, client_id)
        rules = self._rules.get(key)
        if rules is None:
            if len(self._rules) >= CACHE_MAX:
                self._rules.clear()
            rules = self._rules[key] = self.acl.rules(username, client_id) if self.acl is not None else []
        return rules

    def _ask_plugin(self, client_id: str, username: str | None, topic: str, access: str) -> bool | None:
        if self._authorize is None:
            return None
        answer = self._authorize(client_id, username, topic, access)
        return None if answer is None else bool(answer)

    def may_publish(self, username: str | None, client_id: str, topic: str) -> bool:
        return not is_sys(topic) and self._may(username, client_id, topic, WRITE, "write")

    def may_read(self, username: str | None, client_id: str, topic: str) -> bool:
        return self._may(username, client_id, topic, READ, "read")

    def _may(self, username: str | None, client_id: str, topic: str, access: int, name: str) -> bool:
        """The plugin's answer, else the ACL's, cached per (user, client, topic, access)."""
        key = (username, client_id, topic, access)
        answer = self._cache.get(key)
        if answer is None:
            answer = self._ask_plugin(client_id, username, topic, name)
            if answer is None:
                answer = self.acl is None or check_rules(self._client_rules(username, client_id), topic, access)
            self._remember(key, answer, len(topic))
        return answer

    def may_subscribe(self, username: str | None, client_id: str, topic_filter: str, shared: bool) -> bool:
        answer = self._ask_plugin(client_id, username, topic_filter, "subscribe")
        if answer is not None:
            return answer
        if self.acl is None:
            return True
        return check_subscribe(self._client_rules(username, client_id), topic_filter, shared)

    def _remember(self, key: tuple, answer: bool, chars: int) -> None:
        cache = self._cache
        self._cache_chars += chars
        if len(cache) >= CACHE_MAX or self._cache_chars > CACHE_TOPIC_CHARS:
            cache.clear()
            self._cache_chars = chars
        cache[key] = answer


def _answer(answer: Any) -> Reason | None:
    if answer is True:
        return OK
    if answer is False:
        return Reason.BAD_USER_NAME_OR_PASSWORD
    return Reason.NOT_AUTHORIZED  # no opinion, and nothing else knows this user


async def _await_answer(answer: Awaitable[Any]) -> Reason | None:
    return _answer(await answer)


def is_sys(topic: str) -> bool:
    return topic == "$SYS" or topic.startswith("$SYS/")


def may_publish(session: Session, topic: str) -> bool:
    """For client.py: may this session's client publish to ``topic`` (``$SYS/`` never)."""
    acl = session.acl
    if acl is None:
        return not is_sys(topic)
    return acl.may_publish(session.username, session.client_id, topic)
