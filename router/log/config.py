"""``LogConfig``: a commit log's options, what each means and the range it must be in (Kafka's
``LogConfig``), checked once when the log opens.

Why apart from ``CommitLog``: the options are read once, at open, by the parts the log builds
(the writer, the active segment, retention, the linger); the log keeps no option on its append
path but the two it reads per append (``max_batch_bytes``, ``autoflush``). Defaults are
``CommitLog``'s signature's, written there once.
"""

from __future__ import annotations

from typing import NamedTuple

from .format import FORMAT_VERSION, MAX_SEGMENT_POSITION
from .writer import FsyncPolicy


class LogConfig(NamedTuple):
    """A ``CommitLog``'s options (its keyword arguments, ``checked`` once):

    * ``fsync``: ``"always"`` | ``"interval"`` | ``"never"`` (see ``FsyncPolicy``);
      ``fsync_interval_ms``: the ``interval`` period.
    * ``segment_bytes``: roll to a new segment once the next record would pass this size.
    * ``index_interval_bytes``: one index entry per this many bytes of records.
    * ``retention_bytes`` / ``retention_hours``: limits applied by ``enforce_retention``.
    * ``max_batch_bytes``: flush as soon as a batch reaches this size, even mid-iteration.
    * ``max_unsynced_bytes``: with ``interval``, also fsync once this many bytes wait for it.
    * ``page_cache_bytes``: how much of the newest written data stays in the page cache; the writer
      hands older pages back to the kernel (see ``WriterCore``). ``None``: leave it to the kernel.
    * ``autoflush``: with a loop, schedule ``flush`` after the first append of a batch: ``linger_ms``
      later, or with ``call_soon`` (the batch is one loop iteration's worth of appends).
    * ``linger_ms``: with a loop and fsync ``interval``/``never``, the automatic flush comes this long
      after the first append of a batch (sooner once ``max_batch_bytes`` wait), not at the end of
      that loop iteration; ``0``: at the end of the iteration (what ``always`` does anyway: acks
      wait for the write). Why: each flush costs the same whatever its size (a msgpack call, a
      header, a batch to place, a writer round: a thread wake-up, a GIL round trip, a ``pwritev``
      and a report to the loop), and a busy loop iteration holds only tens of PUBLISHes; one flush
      per couple of milliseconds spreads that over hundreds. Appended records are readable from
      memory meanwhile.
    * ``format_version``: 2, the only version written (one CRC and one msgpack body per batch, see
      FORMAT.md). Version 1 segments (an older log) are read; an active segment of version 1 is
      closed and the next flush starts a new segment.
    """

    fsync: FsyncPolicy
    fsync_interval_ms: int
    segment_bytes: int
    index_interval_bytes: int
    retention_bytes: int | None
    retention_hours: float | None
    max_batch_bytes: int
    max_unsynced_bytes: int
    page_cache_bytes: int | None
    autoflush: bool
    format_version: int
    linger_ms: float

    @staticmethod
    def policy(fsync: FsyncPolicy | str) -> FsyncPolicy:
        """``fsync`` as a ``FsyncPolicy``; ValueError naming the three when it is none of them."""
        try:
            return FsyncPolicy(fsync)
        except ValueError:
            raise ValueError(f"fsync must be one of always, interval, never; not {fsync!r}") from None

    def checked(self) -> LogConfig:
        """These options, or ValueError naming the first one out of its range."""
        for ok, wrong in (
                (1 <= self.fsync_interval_ms <= 3_600_000, "fsync_interval_ms must be between 1 and 3600000"),
                (4096 <= self.segment_bytes <= MAX_SEGMENT_POSITION,
                 f"segment_bytes must be between 4096 and {MAX_SEGMENT_POSITION}"),
                (self.index_interval_bytes >= 1, "index_interval_bytes must be positive"),
                (self.retention_bytes is None or self.retention_bytes >= 0, "retention_bytes must be >= 0"),
                (self.retention_hours is None or self.retention_hours >= 0, "retention_hours must be >= 0"),
                (self.max_unsynced_bytes >= 1, "max_unsynced_bytes must be positive"),
                (self.page_cache_bytes is None or self.page_cache_bytes >= 0, "page_cache_bytes must be >= 0"),
                (self.format_version == FORMAT_VERSION,
                 f"format_version must be {FORMAT_VERSION} (version 1 logs are read, not written)"),
                (0 <= self.linger_ms <= 1000, "linger_ms must be between 0 and 1000")):
            if not ok:
                raise ValueError(wrong)
        return self

    @property
    def linger_s(self) -> float:
        """The linger in seconds: none with ``always`` (acknowledgements wait for the write)."""
        return self.linger_ms / 1000.0 if self.fsync is not FsyncPolicy.ALWAYS else 0.0
