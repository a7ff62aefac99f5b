"""The per-router segmented commit log: a standalone library (stdlib + msgpack only).

* ``CommitLog`` — the writer side, driven from an asyncio loop (or synchronously without one).
* ``LogReader``, ``iter_records``, ``iter_record_batches``, ``decode_records`` — read-only access from
  any process (CLI tools, the Spark ``brokerlog`` data source), sharing the one decoder.
* ``check`` — verify a log directory for ``brokerd log check``.

The byte format is described in ``FORMAT.md`` and ``router.log.format``.
"""

from .commitlog import CommitLog
from .errors import CorruptRecord, LogError, LogFormatError, LogUnavailable
from .format import (
    FORMAT_VERSION,
    Record,
    decode_records,
    index_name,
    iter_record_batches,
    iter_records,
    segment_name,
)
from .reader import CheckReport, LogReader, SegmentCheck, SegmentInfo, check
from .retention import DeletedSegment
from .segments import SegmentState
from .writer import FsyncPolicy

__all__ = [
    "FORMAT_VERSION",
    "CheckReport",
    "CommitLog",
    "CorruptRecord",
    "DeletedSegment",
    "FsyncPolicy",
    "LogError",
    "LogFormatError",
    "LogReader",
    "LogUnavailable",
    "Record",
    "SegmentCheck",
    "SegmentInfo",
    "SegmentState",
    "check",
    "decode_records",
    "index_name",
    "iter_record_batches",
    "iter_records",
    "segment_name",
]
