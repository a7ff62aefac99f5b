"""Joining fetched history: the segments of a closed log taken in as a ``CommitLog``'s oldest.

Why it exists: a replica placed at its leader's high-water mark, or a log continued after a lost
disk, starts above records its partition should hold; ``cluster.replication.rules.HistoryState`` fetches
them from a node that holds them into a directory beside the log, and this moves them in.
"""

from __future__ import annotations

import os

from .format import (
    FILE_HEADER_SIZE,
    MAGIC_INDEX,
    MAGIC_LOG,
    index_name,
    pack_file_header,
    segment_name,
)
from .loader import O_CLOEXEC, fsync_dir, load_closed
from .segment import list_segment_files
from .segments import LogSegments, Seg


class HistoryJoin:
    """Moving fetched history in as a log's oldest segments (``CommitLog.join_history``).

    The history is the records of this log's partition below its ``start_offset``, fetched from
    a node that holds them (``cluster.replication.rules.HistoryState``: a replica placed at its leader's
    high-water mark, a log continued after a lost disk) into a directory on this log's file
    system: the files are moved, their indexes checked as at recovery. A gap between the
    history and the log stays a gap (reads skip it). A log that has no segment yet gets its
    empty first one on disk before the history joins, so that a reopen goes on at its offset,
    not at the end of the history.

    The disk work (renames, fsyncs, an index check per segment) is blocking; with a loop it runs
    in a thread (``join_history_async``) while appends, flushes and reads go on: the history's
    segments lie below everything they touch, and join the log's segments once on disk. A log
    closed meanwhile finds them in its directory when it is opened again.

    Holds what never changes after the log is open (its directory, format version and index
    interval), so the disk part can run in any thread, and the log's segments, which only the
    loop-side steps touch: ``check`` and ``take`` on the loop, ``move_in`` between them anywhere.
    """

    def __init__(self, directory: str, version: int, index_interval: int, segments: LogSegments) -> None:
        self._dir = directory
        self._version = version
        self._index_interval = index_interval
        self._segments = segments

    def check(self, last: int, start_offset: int, next_base: int) -> int | None:
        """On the loop, before the disk work: refuse a history that does not end below the log's
        ``start_offset``. Returns the base of the empty first segment to create (``next_base``,
        where appends go on) if the log has no segment yet, else None."""
        if last >= start_offset:
            raise ValueError(f"join_history: a history to {last} for a log that starts at {start_offset}")
        return None if self._segments.all else next_base

    def move_in(self, directory: str, create: int | None) -> list[Seg] | None:
        """The disk part of a join (any thread): create the empty first segment if asked, move the
        history's files in, fsync the directory, check each segment as recovery does. None: the
        history holds no segment. Reads only what never changes after ``__init__``.

        The empty segment is written in place (``O_CREAT``, its header at 0, no truncation, no
        rename): if a flush rolls into the same segment meanwhile, the writer creates the same
        file with the same header, so neither write undoes the other."""
        logs, _ = list_segment_files(directory)
        if not logs:
            return None
        if create is not None:
            for name, magic in ((segment_name(create), MAGIC_LOG), (index_name(create), MAGIC_INDEX)):
                fd = os.open(os.path.join(self._dir, name), os.O_CREAT | os.O_WRONLY | O_CLOEXEC, 0o600)
                try:
                    os.pwrite(fd, pack_file_header(magic, create, self._version), 0)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            fsync_dir(self._dir)  # the segment is on disk before any history file is
        for base in logs:
            for name in (segment_name(base), index_name(base)):
                os.rename(os.path.join(directory, name), os.path.join(self._dir, name))
        fsync_dir(self._dir)
        return [load_closed(self._dir, base, self._index_interval) for base in logs]

    def take(self, segs: list[Seg], create: int | None) -> Seg | None:
        """On the loop, after ``move_in``: the history's segments become the log's oldest. Returns
        the empty first segment created for a log that still has none (nothing flushed meanwhile),
        now its active one; None otherwise."""
        active = None
        if create is not None and not self._segments.all:
            active = self._segments.add(Seg(self._dir, create, FILE_HEADER_SIZE, FILE_HEADER_SIZE, None, None))
        self._segments.prepend(segs)
        return active
