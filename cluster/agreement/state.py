"""The state the nodes agree on, as a pure machine: commands in, results out.

Every replica applies the same commands in the same (log) order, so everything here is
deterministic: no clock, no randomness, no I/O, no library. A command is a small tuple that
msgpack and pickle both carry (a list, as msgpack brings it back, applies the same); a result is a
tuple whose first item is ``OK``, ``STALE`` or ``BAD``.

What is held (one home per concept):

- ``members``: node id -> (address, incarnation). A node joins with a higher incarnation each
  time it starts, so a stale join (an old process's) cannot replace a newer one.
- ``owned``: kind -> key -> (owner, epoch). Sessions are the kind ``session`` (key: the client
  id, owner: the router id); bridges and shared groups are other kinds later.
- ``insync``: router id -> (leader epoch, followers in sync with that router's log).

An owner changes only by a conditional move: "from O at epoch E to P" commits only while the
record is (O, E), so a router acting on an old record is refused (fenced), and two routers
claiming one session at once see one of them win. Epochs come from one counter raised at every
move, so a key's epoch only grows, even across a release and a later claim.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

OK = "ok"
STALE = "stale"  # a condition did not hold: the result carries what holds instead
BAD = "bad"  # malformed or unknown: the same on every replica, so the state stays the same everywhere

SESSION = "session"
INSYNC = "insync"  # the kind a published in-sync set carries (``[INSYNC, router, followers, epoch]``)
SNAPSHOT_VERSION = 1

Command = tuple | list  # a list: a command as msgpack brings it back (the workers' requests)
Result = tuple


class NoAgreement(Exception):
    """No majority committed the proposal in time (or the engine refused it): its outcome is unknown.

    Here, not in ``raft``, so that a worker's client raises it without importing the engine."""


def move(kind: str, key: str, owner: str | None, epoch: int, to: str) -> Command:
    """Claim ``key`` for ``to`` if it is held by ``owner`` at ``epoch`` (None, 0: nobody holds it)."""
    return ("move", kind, key, owner, epoch, to)


def release(kind: str, key: str, owner: str, epoch: int) -> Command:
    """Forget ``key``'s owner if it is still ``owner`` at ``epoch`` (a clean session that ended)."""
    return ("release", kind, key, owner, epoch)


def get(kind: str, key: str) -> Command:
    """Read ``key``'s record through the log: a read that no older leader can answer."""
    return ("get", kind, key)


def join(node: str, address: str, incarnation: int) -> Command:
    return ("join", node, address, incarnation)


def leave(node: str, incarnation: int) -> Command:
    return ("leave", node, incarnation)


def insync(router: str, leader_epoch: int, followers: Iterable[str]) -> Command:
    """Set the followers in sync with ``router``'s log; refused from an older leader epoch."""
    return ("insync", router, leader_epoch, tuple(sorted(followers)))


def all_of(commands: Iterable[Command]) -> Command:
    """A transaction: every command commits, or none (the first that fails is named)."""
    return ("all", tuple(commands))


class State:
    """The replicated state; ``apply`` is the only writer."""

    def __init__(self) -> None:
        self.members: dict[str, tuple[str, int]] = {}
        self.owned: dict[str, dict[str, tuple[str, int]]] = {}
        self.insync: dict[str, tuple[int, frozenset[str]]] = {}
        self.epoch = 0  # the last epoch given out; the next move gets epoch + 1
        self._undo: list[Callable[[], None]] | None = None  # set while an all_of runs

    # -- reads (local: as fresh as this replica; through the log: ``get``) --

    def owner(self, kind: str, key: str) -> tuple[str | None, int]:
        return self.owned.get(kind, {}).get(key, (None, 0))

    def count(self, kind: str) -> int:
        return len(self.owned.get(kind, {}))

    # -- writes --

    def apply(self, command: Command) -> Result:
        """Apply one command; malformed ones change nothing and answer BAD."""
        try:
            handler = _HANDLERS[command[0]]
        except (KeyError, IndexError, TypeError):
            return (BAD, "unknown command")
        try:
            return handler(self, *command[1:])
        except (TypeError, ValueError) as e:
            return (BAD, f"{command[0]}: {type(e).__name__}")

    def apply_batch(self, commands: Iterable[Command]) -> list[Result]:
        """One log entry: its commands apply in order with nothing between them, each on its own."""
        return [self.apply(c) for c in commands]

    def _set(self, table: dict, key: Any, value: Any) -> None:
        """Write through the undo log, so an ``all_of`` that fails leaves no trace."""
        if self._undo is not None:
            old = table.get(key, _ABSENT)
            self._undo.append(lambda: table.pop(key, None) if old is _ABSENT else table.__setitem__(key, old))
        if value is _ABSENT:
            table.pop(key, None)
        else:
            table[key] = value

    def _move(self, kind: str, key: str, owner: str | None, epoch: int, to: str) -> Result:
        _check_str(kind, key, to)
        current = self.owner(kind, key)
        if current != (owner, epoch):
            return (STALE, *current)
        if kind not in self.owned:
            self._set(self.owned, kind, {})
        if self._undo is not None:
            before = self.epoch
            self._undo.append(lambda: setattr(self, "epoch", before))
        self.epoch += 1
        self._set(self.owned[kind], key, (to, self.epoch))
        return (OK, to, self.epoch)

    def _release(self, kind: str, key: str, owner: str, epoch: int) -> Result:
        current = self.owner(kind, key)
        if current != (owner, epoch) or owner is None:
            return (STALE, *current)
        self._set(self.owned[kind], key, _ABSENT)
        return (OK, None, epoch)

    def _get(self, kind: str, key: str) -> Result:
        return (OK, *self.owner(kind, key))

    def _join(self, node: str, address: str, incarnation: int) -> Result:
        _check_str(node, address)
        _check_int(incarnation)
        current = self.members.get(node)
        if current == (address, incarnation):
            return (OK, address, incarnation)  # said again: the same answer
        if current is not None and current[1] >= incarnation:
            return (STALE, *current)  # an older process, or one incarnation at two addresses
        self._set(self.members, node, (address, incarnation))
        return (OK, address, incarnation)

    def _leave(self, node: str, incarnation: int) -> Result:
        current = self.members.get(node)
        if current is None or current[1] != incarnation:
            return (STALE, *(current or (None, 0)))
        self._set(self.members, node, _ABSENT)
        return (OK, None, incarnation)

    def _insync(self, router: str, leader_epoch: int, followers: Iterable[str]) -> Result:
        _check_str(router, *followers)
        _check_int(leader_epoch)
        current = self.insync.get(router)
        if current is not None and current[0] > leader_epoch:
            return (STALE, current[0], tuple(sorted(current[1])))
        self._set(self.insync, router, (leader_epoch, frozenset(followers)))
        return (OK, leader_epoch, tuple(sorted(followers)))

    def _all(self, commands: Iterable[Command]) -> Result:
        outer, self._undo = self._undo, []
        try:
            results = []
            for i, c in enumerate(commands):
                r = self.apply(c)
                if r[0] != OK:
                    for undo in reversed(self._undo):
                        undo()
                    return (STALE if r[0] == STALE else BAD, i, r)
                results.append(r)
            if outer is not None:
                outer.extend(self._undo)  # a nested all_of undoes with its parent
            return (OK, tuple(results))
        finally:
            self._undo = outer

    # -- snapshot: the whole state as msgpack-able data --

    def snapshot(self) -> dict:
        return {
            "version": SNAPSHOT_VERSION,
            "epoch": self.epoch,
            "members": {n: [a, i] for n, (a, i) in self.members.items()},
            "owned": {k: {key: [o, e] for key, (o, e) in t.items()} for k, t in self.owned.items()},
            "insync": {r: [e, sorted(f)] for r, (e, f) in self.insync.items()},
        }

    @classmethod
    def restore(cls, snap: dict) -> State:
        if snap.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"agreement snapshot version {snap.get('version')!r}, expected {SNAPSHOT_VERSION}")
        s = cls()
        s.epoch = snap["epoch"]
        s.members = {n: (a, i) for n, (a, i) in snap["members"].items()}
        s.owned = {k: {key: (o, e) for key, (o, e) in t.items()} for k, t in snap["owned"].items()}
        s.insync = {r: (e, frozenset(f)) for r, (e, f) in snap["insync"].items()}
        return s


class _Absent:
    __slots__ = ()


_ABSENT = _Absent()


def _check_str(*values: object) -> None:
    for v in values:
        if not isinstance(v, str):
            raise TypeError("expected a string")


def _check_int(*values: object) -> None:
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError("expected a non-negative integer")


_HANDLERS: dict[str, Callable[..., Result]] = {
    "move": State._move,
    "release": State._release,
    "get": State._get,
    "join": State._join,
    "leave": State._leave,
    "insync": State._insync,
    "all": State._all,
}
