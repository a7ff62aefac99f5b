"""What passes between the event loop and the writer: batches, commands and reports.

The loop places records (``Chunk``: which bytes go where) and hands the writer a ``Batch`` it no
longer mutates; it can also ask for an fsync, a retry, segment deletions or a stop (the commands
below). The writer answers each round with a ``Report``. Nothing else is shared between the two,
so the loop and the writer thread never touch the same mutable state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(slots=True)
class Chunk:
    """The part of a batch that goes into one segment: ``data`` (a version 2 batch: header and
    body, written as they are, so the body is not copied once more just to be joined), bytes
    ``buf_start:buf_end`` of the batch's content, at ``file_pos`` of segment ``base``, plus the
    index entries for it at ``index_pos``."""

    base: int
    file_pos: int
    buf_start: int
    buf_end: int
    index: bytes
    index_pos: int
    new_segment: bool  # the segment file does not exist yet: create it and write the headers
    data: tuple[bytes, ...]


@dataclass(slots=True, eq=False)
class Batch:
    """Records the loop flushed: their chunks, and the offsets they hold."""

    chunks: list[Chunk]
    first_offset: int
    last_offset: int

    @property
    def size(self) -> int:
        """Bytes this batch writes."""
        chunks = self.chunks
        if len(chunks) == 1:  # the commonest, several times per flush
            return chunks[0].buf_end - chunks[0].buf_start
        return sum(c.buf_end - c.buf_start for c in chunks)

    def content(self) -> bytes:
        """The batch's bytes back to back (for reads of records not yet written)."""
        return b"".join(p for c in self.chunks for p in c.data)


class Report(NamedTuple):
    """What the writer tells the loop after each round."""

    written_offset: int       # last offset handed to the OS
    durable_offset: int       # last offset known fsynced
    error: OSError | None     # the failed state, None when healthy
    recover_attempted: bool   # this round included a try_recover request
    final: bool = False       # the writer stopped
    round: int = 0            # the core's round that made it: the newer one says whether it is healthy


@dataclass(frozen=True, slots=True)
class Command:
    """A request to the writer besides a batch: what its next round does on top of writing.
    The thread ORs the fields of every command it finds queued into one round."""

    force_sync: bool = False  # fsync what is written, whatever the policy
    recover: bool = False     # write again what a failure held back
    stop: bool = False        # the last round: close the files, end the thread


SYNC = Command(force_sync=True)         # ``flush(fsync=True)``
RECOVER = Command(recover=True)         # ``try_recover``
STOP = Command(recover=True, stop=True)  # ``close``: one last try to write what a failure held back
WAKE = Command()  # the loop's write made the core dirty, or reached max_unsynced_bytes: fsync when due


@dataclass(slots=True)
class Delete:
    """Unlink these segments (retention): on the writer thread, so the loop does no I/O."""

    bases: list[int]


Item = Batch | Command | Delete  # what the loop puts on the writer thread's queue
