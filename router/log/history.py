"""Joining fetched history: the segments of a closed log taken in as a ``CommitLog``'s oldest.

Why it exists: a replica placed at its leader's high-water mark, or a log continued after a lost
disk, starts above records its partition should hold; ``router.replication.HistoryState`` fetches
them from a node that holds them into a directory beside the log, and this moves them in. The disk
work (renames, fsyncs, an index check per segment) can run in a thread while the loop goes on:
the history's segments lie below everything appends, flushes and reads touch.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from .format import (
    FILE_HEADER_SIZE,
    MAGIC_INDEX,
    MAGIC_LOG,
    index_name,
    pack_file_header,
    segment_name,
)
from .loader import NO_TS, O_CLOEXEC, Seg, fsync_dir, load_closed
from .scan import NO_INDEX_YET
from .segment import list_segment_files


class HistoryJoin:
    """``CommitLog``'s history join (a mixin: the state is the log's own)."""

    _dir: str
    _version: int
    _index_interval: int
    _segs: list[Seg]
    _bases: list[int]
    _by_base: dict[int, Seg]
    _buf_first: int
    _closed: bool

    if TYPE_CHECKING:  # the log's own property (a declared attribute would be writable)
        @property
        def start_offset(self) -> int: ...

    def join_history(self, directory: str, last: int) -> int:
        """Take the segments of a closed log in ``directory`` in as this log's oldest: the records
        of this log's partition below ``start_offset`` (up to ``last``), fetched from a node that
        holds them (``router.replication.HistoryState``: a replica placed at its leader's
        high-water mark, a log continued after a lost disk). ``directory`` must be on this log's
        file system (the files are moved); their indexes are checked as at recovery. Returns how
        many segments joined. A gap between the history and the log stays a gap (reads skip it).

        A log that has no segment yet gets its empty first one on disk before the history
        joins, so that a reopen goes on at its offset, not at the end of the history.

        Blocking (renames, fsyncs, index checks): a log with a loop joins with
        ``await join_history_async(...)``, which does the same work in a thread."""
        create = self._join_begin(last)
        return self._join_end(self._join_disk(directory, create), create)

    async def join_history_async(self, directory: str, last: int) -> int:
        """``join_history`` with its disk work in a thread of the loop's executor: the loop never
        waits for the disk (a history of many segments takes an fsync and an index check each).
        Appends, flushes and reads go on meanwhile; the history's segments lie below everything
        they touch, and join the log's view of its segments once on disk. A log closed meanwhile
        finds them in its directory when it is opened again."""
        create = self._join_begin(last)
        loop = asyncio.get_running_loop()
        segs = await loop.run_in_executor(None, self._join_disk, directory, create)
        return self._join_end(segs, create)

    def _join_begin(self, last: int) -> int | None:
        """Check a join on the loop; the base of the empty first segment to create, if the log has none."""
        if last >= self.start_offset:
            raise ValueError(f"join_history: a history to {last} for a log that starts at {self.start_offset}")
        return None if self._segs else self._buf_first

    def _join_disk(self, directory: str, create: int | None) -> list[Seg] | None:
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

    def _join_end(self, segs: list[Seg] | None, create: int | None) -> int:
        """On the loop: the history's segments become the log's oldest."""
        if segs is None or self._closed:
            return 0
        if create is not None and not self._segs:  # nothing flushed meanwhile: the empty segment is the active one
            self._add_seg(Seg(self._dir, create, FILE_HEADER_SIZE, FILE_HEADER_SIZE, None, None))
            self._set_active(create, FILE_HEADER_SIZE, FILE_HEADER_SIZE, NO_INDEX_YET, NO_TS)
        current, self._segs, self._bases, self._by_base = self._segs, [], [], {}
        for seg in (*segs, *current):
            self._add_seg(seg)
        return len(segs)

    def _add_seg(self, seg: Seg) -> None:
        raise NotImplementedError  # CommitLog's

    def _set_active(self, base: int, size: int, index_size: int, last_index_pos: int, max_ts: int) -> None:
        raise NotImplementedError  # CommitLog's
