"""A moved session's backlog, kept on its new router's disk.

A session that moves to another node brings its offline backlog as copies: that node cannot read
this node's logs (on one node the backlog moves as positions, ``LogRange``). Before this module
the new owner kept at most ``--max-queued`` of them, in memory: the rest was dropped (counted
``queue_full``), and what was kept was lost if that router crashed before delivering it, so a
move lost acknowledged messages. Now the new owner, when it has a log, writes every copy, as the
transfer streams in, to one spool file per transfer under ``<data-dir>/<node>/_spool/`` and syncs
it before it takes the session (and so before it confirms the move, which is when the old router
lets its copy go). The session reads the file back as it reads a ``LogRange``: lazily, a batch at
a time, so a backlog of any size moves in bounded memory, and its snapshot names the range (from
the oldest entry it still holds unacknowledged), so a restart delivers the rest.

The file is a sequence of msgpack items, each one queue entry as a takeover carries it
(``[qos, retain, message values]``): what the session delivers is exactly what the old router had
queued for it (delivery QoS, retain flag, subscription identifiers), with no filtering on the way
back. Its range is ``[path, start, end]`` in bytes, in the session's ``ranges`` and so in the
snapshot: a restart reads on from where the last snapshot says.

The file belongs to one router, named by its file name's prefix: a move to another router of
the same node gives it that router's name too (``adopt``, a hard link). A router deletes its name
of the file once all it gave is acknowledged, when its session ends or moves on, and at start
when no session of its snapshot names it (``collect``: a transfer a crash cut short).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Literal

import msgpack

log = logging.getLogger(__name__)

SPOOL_DIR = "_spool"  # beside the node's router directories ("_": not a router's log)
SUFFIX = ".spool"
READ_BYTES = 1 << 20  # read back this much of the file at a time, at most


def spool_dir(log_directory: str) -> str:
    """The spool directory of the node whose router logs to ``log_directory``."""
    return os.path.join(os.path.dirname(os.path.abspath(log_directory)), SPOOL_DIR)


def is_spool(path: str) -> bool:
    return path.endswith(SUFFIX)


def owner_of(path: str) -> str:
    """The router name (``w0``) a spool file belongs to."""
    return os.path.basename(path).split("-", 1)[0]


class SpoolWriter:
    """One transfer's overflow, written as it arrives; ``finish`` makes it durable."""

    __slots__ = ("path", "_file", "count", "spans")

    def __init__(self, log_directory: str) -> None:
        directory = spool_dir(log_directory)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        owner = os.path.basename(os.path.abspath(log_directory))
        self.path = os.path.join(directory, f"{owner}-{uuid.uuid4().hex}{SUFFIX}")
        self._file: Any = open(self.path, "xb")  # noqa: SIM115 - closed by finish or discard
        os.chmod(self.path, 0o600)
        self.count = 0
        # Where the copies lie in their origin routers' logs (``spans``): the highest offset is
        # what a session taken from a replica asks the other routers for begins after
        # (``Replication.adopted``); the whole span is what a read-back asks for if this node
        # is lost before the session read the file (``Session.copy_spans``).
        self.spans: dict[str, list] = {}

    def add(self, items: Iterable[Sequence[Any]]) -> None:
        """Queue entries, lists or tuples ``[qos, dup, message values]`` (Sequence: compiled, a
        declared ``list`` is checked as one, and a takeover's chunks hold tuples)."""
        pack = msgpack.Packer().pack
        write = self._file.write
        spans = self.spans
        for item in items:
            write(pack(item))
            values = item[2]
            note_span(spans, values[5], values[6])
            self.count += 1

    def finish(self, sync: bool = True) -> SpoolRange:
        """Flush and (``sync``) fsync the file and its directory entry: the range of what was
        written."""
        f = self._file
        f.flush()
        if sync:
            os.fsync(f.fileno())
        end = f.tell()
        f.close()
        if sync:
            dfd = os.open(os.path.dirname(self.path), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return SpoolRange(self.path, 0, end, self.spans)

    def finish_into(self, state: dict, sync: bool = True) -> None:
        """``finish``, and name the spool in a session's takeover state: its range (``spool``,
        with its spans) and the marks a replica's read-back starts after (``spool_marks``)."""
        state["spool"] = self.finish(sync).to_list()
        state["spool_marks"] = {origin: span[1] for origin, span in self.spans.items()}

    def discard(self) -> None:
        """The transfer failed or its offer was passed over: the file goes."""
        if not self._file.closed:
            self._file.close()
        remove(self.path)


def note_span(spans: dict[str, list], origin: Any, offset: Any) -> None:
    """Widen ``spans`` ({origin router: [lowest, highest offset, in order]}) by one copy's place
    in its origin's log; ``in order`` stays true while each origin's offsets only grow (then a
    reader may move the lowest past what it read: ``SpoolRange.read``). A copy without a place
    (no log at its origin) is not noted: no log can give it again."""
    if offset.__class__ is not int or offset < 0 or origin.__class__ is not str or not origin:
        return
    span = spans.get(origin)
    if span is None:
        spans[origin] = [offset, offset, True]
    elif offset > span[1]:
        span[1] = offset
    else:
        span[2] = False
        if offset < span[0]:
            span[0] = offset


def valid_spans(value: Any) -> dict[str, list]:
    """``value`` (from a snapshot or a peer) as spans, what is malformed left out."""
    if value.__class__ is not dict:
        return {}
    return {o: [lo, hi, bool(s[2]) if len(s) > 2 else False] for o, s in value.items()
            if o.__class__ is str and s.__class__ is list and len(s) >= 2
            and (lo := s[0]).__class__ is int and (hi := s[1]).__class__ is int and 0 <= lo <= hi}


class SpoolRange:
    """Bytes ``[start, end)`` of a spool file still to deliver; the same interface as
    ``LogRange`` (``read``, ``close``, ``to_list``), but what it reads are queue entries.

    ``spans`` says where the entries not read yet lie in their origins' logs ({origin: [lowest,
    highest offset, in order]}, ``note_span``): a session's replicated state names them, so that
    if this node is lost before the file is read, the router that takes the session from a
    replica reads them back from those logs (``Replication.read_back_copies``). The spool is on
    this node's disk only."""

    __slots__ = ("directory", "start", "end", "owned", "spans", "_file")
    copies: ClassVar[Literal[True]] = True  # its reads are queue entries, not log records to match

    def __init__(self, path: str, start: int, end: int, spans: Any = None, owned: bool = True) -> None:
        self.directory = path  # (the name LogRange gives its location)
        self.start = start
        self.end = end
        self.spans = valid_spans(spans)
        self.owned = owned  # False: a reader of another's range (an export), which leaves the file
        self._file: Any = None

    def read(self, batch: int, now: float | None = None) -> list | None:
        """The next queue entries (up to ``batch``) as ``(position, entry)``, the position being
        the entry's byte offset in the file; None once the range is done or cannot be read
        (logged: what is left of it is lost). The file stays until ``discard``. (``now``: as
        ``LogRange.read``'s; a spool is written whole before it is read, so nothing waits.)"""
        if self.start >= self.end:
            self.close()
            return None
        try:
            if self._file is None:
                self._file = open(self.directory, "rb")  # noqa: SIM115 - closed by close()
            f = self._file
            f.seek(self.start)
            fed = self.start
            unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=0)
            items: list = []
            at = 0
            while True:
                for item in unpacker:
                    items.append((self.start + at, item))
                    at = unpacker.tell()
                    if len(items) >= batch:
                        break
                if len(items) >= batch or fed >= self.end:
                    break
                data = f.read(min(READ_BYTES, self.end - fed))
                if not data:
                    if items:
                        break  # what is whole first; the next read finds the end short
                    raise OSError(f"the file ends at byte {fed}, {self.end - fed} bytes short")
                fed += len(data)
                unpacker.feed(data)
            if not items:
                raise ValueError(f"no whole entry in bytes {self.start}..{self.end}")
        except FileNotFoundError:
            log.warning("spool %s [%d, %d) is gone (read to its end just before a restart, or deleted): "
                        "given up", self.directory, self.start, self.end)
            self.start = self.end
            return None
        except (OSError, ValueError, msgpack.UnpackException) as exc:
            log.error("spool %s [%d, %d) unreadable (%s): given up", self.directory, self.start, self.end, exc)
            self.close()
            self.start = self.end
            return None
        self.start += at
        spans = self.spans
        if spans:  # what is read is held by the session until acknowledged (``copy_spans``)
            for _, (_, _, values) in items:
                span = spans.get(values[5])
                if span is not None and span[2] and values[6].__class__ is int and values[6] >= span[0]:
                    if values[6] >= span[1]:
                        del spans[values[5]]
                    else:
                        span[0] = values[6] + 1
        return items

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def to_list(self) -> list:
        return [self.directory, self.start, self.end, {o: list(s) for o, s in self.spans.items()}]

    def for_export(self) -> SpoolRange:
        """A reader of the same entries for a move's export, which leaves the file (not ``owned``)."""
        directory, start, end, spans = self.to_list()
        return SpoolRange(directory, start, end, spans, owned=False)

    def adopt(self, log_directory: str) -> None:
        """This range moved to the router that logs to ``log_directory`` (a same-node move): the
        file gets a second name, that router's (a hard link), which it reads, deletes when done
        and keeps at its start-up; the old router's name goes when it lets its copy of the
        session go (a move that is not confirmed leaves it the file as it was)."""
        owner = os.path.basename(os.path.abspath(log_directory))
        if owner_of(self.directory) == owner:
            return
        name = os.path.basename(self.directory).split("-", 1)[1]
        path = os.path.join(os.path.dirname(self.directory), f"{owner}-{name}")
        try:
            os.link(self.directory, path)
        except FileExistsError:
            pass
        except OSError as exc:
            log.error("spool %s could not be taken over (%s): read where it is, and left there", self.directory,
                      exc)
            self.owned = False
            return
        self.close()
        self.directory = path

    def discard(self) -> None:
        """Its session ended, or its backlog went to another node as copies: the file goes."""
        self.close()
        if self.owned:
            remove(self.directory)


def spool_into(state: dict, log_directory: str, chunks: Iterable[list], sync: bool = True) -> None:
    """Spool every copy of ``chunks`` (a takeover's, read whole on this router) and name the
    file in ``state`` (``finish_into``; fsynced when ``sync``); nothing is written when there
    is no copy. A failure removes what was written and raises ``OSError``."""
    writer: SpoolWriter | None = None
    try:
        for chunk in chunks:
            if chunk:
                if writer is None:
                    writer = SpoolWriter(log_directory)
                writer.add(chunk)
        if writer is not None:
            writer.finish_into(state, sync)
    except OSError:
        if writer is not None:
            writer.discard()
        raise


def spooled(log_directory: str, items: list, sync: bool) -> SpoolRange:
    """``items`` (queue entries: copies read back for one session) in a spool file of their own,
    fsynced when ``sync`` (the log's ``--fsync always``: a read-back at a failover writes one
    file per answer, and with the log's other policies a crash of the process loses no written
    byte either): its range. A failure removes what was written and raises ``OSError``."""
    state: dict = {}
    spool_into(state, log_directory, [items], sync)
    return SpoolRange(*state["spool"])


def drop_named(state: dict) -> None:
    """A session's takeover state not taken in (an offer passed over, a clean start): the spool
    it names goes."""
    if state.get("spool"):
        remove(state["spool"][0])


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("spool %s could not be removed: %s", path, exc)


def collect(log_directory: str, named: Iterable[str]) -> int:
    """At start: delete this router's spool files that no session here names (``named``: the
    paths its restored sessions' ranges name) — a transfer cut short by a crash, a file read to
    its end just before one. Returns how many were deleted."""
    directory = spool_dir(log_directory)
    owner = os.path.basename(os.path.abspath(log_directory))
    keep = {os.path.abspath(p) for p in named}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    gone = 0
    for name in names:
        path = os.path.join(directory, name)
        if is_spool(name) and owner_of(name) == owner and path not in keep:
            remove(path)
            gone += 1
    return gone
