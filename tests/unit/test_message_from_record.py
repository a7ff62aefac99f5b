"""A message read back from the log (``Message.from_record``): its origin offset is an int
whatever the record holds, -1 where the record says none (a copy whose origin did not say where
its log holds it), as the log format documents it, so that a mark compares with it."""

from __future__ import annotations

from brokerd.router.log.format import Record
from brokerd.router.message import Message


def _record(origin_offset: int | None) -> Record:
    return Record(7, 1_000, "f1/w0", origin_offset, "p", "t/x", 1, False, b"", b"m")  # type: ignore[arg-type]


def test_an_origin_offset_read_back_as_none_is_minus_one() -> None:
    msg = Message.from_record(_record(None))
    assert msg.origin_offset == -1 and msg.log_offset == 7
    assert msg.origin_offset >= -1  # (None would raise here, as a catch-up's mark comparison did)


def test_an_origin_offset_is_kept() -> None:
    assert Message.from_record(_record(41)).origin_offset == 41
