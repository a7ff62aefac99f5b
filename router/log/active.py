"""The active segment as the appender sees it: where the next batch is placed, and the roll.

Why apart from ``CommitLog``: placing is per flush, never per append, and it is the only code that
knows the active segment's layout (its size including bytes not yet written, its index entries,
its newest timestamp); the log's append path only keeps field tuples. A batch placed here is a
list of ``Chunk`` (which bytes go where) for the writer; the segment's ``Seg`` in the log's
segments is brought up to date with each placement and roll (``segments.LogSegments``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from .format import (
    BATCH_HEADER_SIZE,
    FILE_HEADER_SIZE,
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE,
    MAX_ARRAY_HEADER,
    encode_batch,
)
from .messages import Chunk
from .scan import NO_INDEX_YET
from .segments import NO_TS, LogSegments, Seg

_first_item = operator.itemgetter(0)


class ActiveSegment:
    """Places batches of records (field tuples, packed) at the end of the active segment, rolling
    to a new one when a batch does not fit (``segment_bytes``) or the active one is of the other
    format version (``must_roll``). No I/O: the writer creates the new segment's files with its
    first chunk."""

    def __init__(self, directory: str, segment_bytes: int, index_interval: int, segments: LogSegments,
                 pack: Callable[[Any], bytes]) -> None:
        self._dir = directory
        self._segment_bytes = segment_bytes
        self._index_interval = index_interval
        self._segments = segments
        self._pack = pack  # the log's packer (one for the log's life: its buffer stays warm)
        self.base = -1
        self.size = 1 << 62  # bytes assigned, including those not yet written; none yet: the first batch rolls
        self.index_size = FILE_HEADER_SIZE
        self.last_index_pos = NO_INDEX_YET
        self.max_ts = NO_TS
        self.chunk_new = False  # the next chunk placed opens its segment (the writer creates the file)
        self.must_roll = False  # the active segment is of the other format version: never append to it

    def resume(self, base: int, size: int, index_size: int, last_index_pos: int, max_ts: int) -> None:
        """Appends go on in segment ``base`` (``loader.Tail``'s fields), which exists on disk."""
        self.base = base
        self.size = size
        self.index_size = index_size
        self.last_index_pos = last_index_pos
        self.max_ts = max_ts
        self.chunk_new = False

    def resume_empty(self, base: int) -> None:
        """Appends go on in segment ``base``, which holds no record yet."""
        self.resume(base, FILE_HEADER_SIZE, FILE_HEADER_SIZE, NO_INDEX_YET, NO_TS)

    def place(self, first: int, recs: list[Any], body: bytes) -> list[Chunk]:
        """Place records ``first``.. (``body``: their msgpack) and return the chunks to write.

        Normally that is one batch: one CRC, a few struct packs and one index entry at most,
        placed here without a further call (at a fixed rate every flush is a message or two, run
        from cold caches: each call and each object on the way costs). Only when the batch does
        not fit the active segment are the records packed one by one to cut it at segment
        boundaries.
        """
        pos = self.size
        if self.must_roll or (pos + BATCH_HEADER_SIZE + len(body) > self._segment_bytes
                              and not (len(recs) == 1 and pos == FILE_HEADER_SIZE)):
            chunks: list[Chunk] = []
            self._place_split(first, recs, chunks)
        else:
            chunks = [self._place_batch(first, recs, body, pos, 0)]
        active = self._segments.all[-1]
        active.size = self.size
        active.last_offset = first + len(recs) - 1
        active.max_ts = self.max_ts
        return chunks

    def _roll(self, offset: int) -> None:
        """Start a new segment at ``offset``; its file is created by the writer with the first chunk."""
        segments = self._segments
        if segments.all:
            old = segments.all[-1]
            old.size = self.size
            old.last_offset = offset - 1 if offset > old.base else old.last_offset
            old.max_ts = self.max_ts if self.max_ts != NO_TS else old.max_ts
        segments.add(Seg(self._dir, offset, FILE_HEADER_SIZE, 0, None, None))
        self.resume_empty(offset)
        self.chunk_new = True  # its files do not exist yet
        self.must_roll = False

    def _place_split(self, first: int, recs: list[Any], chunks: list[Chunk]) -> None:
        """Cut ``recs`` into batches that fit their segments, rolling as needed; a record bigger
        than a segment gets a segment (and a batch) of its own."""
        pack = self._pack
        sizes = [len(pack(r)) for r in recs]
        i, n = 0, len(recs)
        while i < n:
            if self.must_roll:
                self._roll(first + i)
            room = self._segment_bytes - self.size - BATCH_HEADER_SIZE - MAX_ARRAY_HEADER
            j = i
            while j < n and sizes[j] <= room:
                room -= sizes[j]
                j += 1
            if j == i:
                if self.size > FILE_HEADER_SIZE:
                    self._roll(first + i)
                    continue
                j = i + 1
            part = recs[i:j]
            chunks.append(self._place_batch(first + i, part, pack(part), self.size,
                                            chunks[-1].buf_end if chunks else 0))
            i = j

    def _place_batch(self, base: int, recs: list[Any], body: bytes, pos: int, buf_start: int) -> Chunk:
        """Put one batch at ``pos``, the end of the active segment: header, index entry, chunk
        (its bytes from ``buf_start`` of the batch's content)."""
        max_ts = recs[0][0] if len(recs) == 1 else max(map(_first_item, recs))
        header, body = encode_batch(base, recs, body, max_ts)
        if max_ts > self.max_ts:
            self.max_ts = max_ts
        index = b""
        index_pos = self.index_size
        if pos - self.last_index_pos >= self._index_interval:
            index = INDEX_ENTRY.pack(base - self.base, pos, self.max_ts)
            self.last_index_pos = pos
            self.index_size = index_pos + INDEX_ENTRY_SIZE
        size = len(header) + len(body)
        self.size = pos + size
        new = self.chunk_new
        self.chunk_new = False
        return Chunk(self.base, pos, buf_start, buf_start + size, index, index_pos, new, (header, body))
