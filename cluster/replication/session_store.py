"""The sessions held here for other routers (session replicas), pure: no mesh, no disk, no clock.

A follower holds each leader's persistent sessions as its snapshot states them
({partition: {client id: state}}), changed by SESSION_STATE (a full set, or changes), by
SESSION_GONE (taken over elsewhere; a will published elsewhere), and by a takeover answered
from here (``hand``: the copy stays held until the new owner has it, ``moved``). What changed is
marked ``dirty`` until the caller writes it to disk (``take_dirty``). The leader's side is
``changes``: what to send its followers for a new snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from brokerd.router.session import recency

State = dict  # a session's state as the snapshot holds it (``router.persistence``)


def changes(sent: dict[str, State], sessions: dict[str, State]) -> dict[str, State | None]:
    """A leader's SESSION_STATE changes from the sessions last sent to ``sessions`` now: the
    new and changed ones, and None for each one gone."""
    updates: dict[str, State | None] = {cid: st for cid, st in sessions.items() if sent.get(cid) != st}
    updates.update((cid, None) for cid in sent if cid not in sessions)
    return updates


class SessionStore:
    """The sessions of other routers held here, and those being handed over from here."""

    def __init__(self) -> None:
        self.held: dict[str, dict[str, State]] = {}  # partition -> client id -> state
        self.dirty: set[str] = set()  # partitions changed since they were last written
        self.handing: dict[str, tuple[str, State]] = {}  # client id -> (partition, state) being handed over

    def mark(self, partition: str) -> None:
        self.dirty.add(partition)

    def take_dirty(self) -> set[str]:
        """The partitions to write now (none marked after)."""
        dirty, self.dirty = self.dirty, set()
        return dirty

    def load(self, partition: str, held: object) -> None:
        """What a restart found on disk for ``partition`` (ignored unless a non-empty dict)."""
        if isinstance(held, dict) and held:
            self.held[partition] = held

    def apply(self, partition: str, full: bool, updates: dict[str, State | None]) -> None:
        """SESSION_STATE from ``partition``'s leader: a full set replaces what is held."""
        held = self.held.setdefault(partition, {})
        if full:
            held.clear()
        for cid, st in updates.items():
            if st is None:
                held.pop(cid, None)
            else:
                held[cid] = st
        self.mark(partition)

    def forget(self, partition: str, client_ids: Iterable[str], wills: Iterable[str] = ()) -> bool:
        """SESSION_GONE: ``client_ids`` were taken over elsewhere, the wills of ``wills`` were
        published elsewhere. Whether anything held changed (then it is marked)."""
        held = self.held.get(partition, {})
        changed = False
        for cid in client_ids:
            changed = held.pop(cid, None) is not None or changed
        for cid in wills:
            if self.clear_will(partition, cid, mark=False):
                changed = True
        if changed:
            self.mark(partition)
        return changed

    def clear_will(self, partition: str, client_id: str, mark: bool = True) -> bool:
        """The will held with a session is published (here or elsewhere): not again."""
        st = self.held.get(partition, {}).get(client_id)
        if st is None:
            return False
        st["will"] = st["live_will"] = None
        if mark:
            self.mark(partition)
        return True

    def holds(self, client_id: str) -> bool:
        """Whether any partition's sessions held here name ``client_id``."""
        return any(client_id in held for held in self.held.values())

    def found(self, client_id: str, hears: Callable[[str], bool]) -> list[tuple[str, State]]:
        """(partition, state) of every silent router (``hears`` is False) whose sessions held
        here name ``client_id``."""
        return [(partition, held[client_id]) for partition, held in self.held.items()
                if client_id in held and not hears(partition)]

    @staticmethod
    def newest(found: list[tuple[str, State]]) -> tuple[str, State]:
        """Of two silent routers that both had the session (it moved between them shortly before
        their node died), the most recent copy counts."""
        return max(found, key=lambda f: recency(f[1]))

    def hand(self, client_id: str, partition: str, st: State, stale: Iterable[str]) -> None:
        """The session of ``partition`` is being handed over from here; its copies held for the
        ``stale`` partitions are dropped now."""
        for p in stale:
            del self.held[p][client_id]
            self.mark(p)
        self.handing[client_id] = (partition, st)

    def moved(self, client_id: str, ok: bool) -> bool:
        """The handover ended: taken (``ok``: the copy is dropped, unless it changed meanwhile)
        or failed (it stays held). Whether the copy was dropped."""
        handing = self.handing.pop(client_id, None)
        if handing is None or not ok:
            return False
        partition, st = handing
        held = self.held.get(partition, {})
        if held.get(client_id) is not st:
            return False
        del held[client_id]
        self.mark(partition)
        return True

    def counts(self) -> dict[str, int]:
        """Sessions held per partition (for stats)."""
        return {p: len(held) for p, held in self.held.items() if held}

    def delayed_wills(self) -> dict[str, int]:
        """Per partition, the offline sessions held with a delayed will waiting."""
        return {p: n for p, held in self.held.items() if (n := sum(1 for st in held.values() if st.get("will")))}
