"""Exceptions of the commit log.

They are separate from the rest of the broker on purpose: the log is a standalone library that CLI
tools and the Spark data source import without pulling in the broker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .format import Record


class LogError(Exception):
    """Base class of every error raised by ``router.log``."""


class LogUnavailable(LogError):
    """The log cannot accept appends: a write failed (disk full, read-only, I/O error) or it is closed.

    The broker catches this to refuse QoS 1/2 publishes instead of acknowledging something it cannot
    store. ``cause`` is the ``OSError`` that put the log in the failed state (None when closed).
    """

    def __init__(self, message: str, cause: OSError | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class LogFormatError(LogError):
    """A file is not a segment or index of this format (bad magic) or has a version we cannot read.

    Raised rather than "repaired": truncating a file written by a newer version would destroy data.
    """


class CorruptRecord(LogError):
    """A record whose length fields disagree or whose CRC does not match.

    ``position`` is the byte position of the bad record in the buffer (or file) that was decoded,
    ``records`` the records decoded before it and ``consumed`` the bytes they took, so a caller can keep
    the good prefix and decide what to do with the rest.
    """

    def __init__(self, position: int, reason: str, records: list[Record] | None = None,
                 consumed: int = 0) -> None:
        super().__init__(f"corrupt record at position {position}: {reason}")
        self.position = position
        self.reason = reason
        self.records: list[Record] = records if records is not None else []
        self.consumed = consumed
