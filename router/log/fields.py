"""A record's fields as ``CommitLog.append_fields`` takes them, from callers it does not trust.

The broker appends what its MQTT codec already checked (``append_fields``, no checks: it runs per
PUBLISH). Everyone else (``append``, ``append_bytes``: tools, tests, batch jobs) comes through
here: strings as ``str`` or UTF-8 bytes, the limits checked before anything is appended.
"""

from __future__ import annotations

import time
from typing import Any

_time_ns = time.time_ns


def from_values(topic: str | bytes, payload: bytes, qos: int, retain: bool, client_id: str | bytes,
                properties: bytes, origin_router: str | bytes | None, origin_offset: int | None,
                timestamp_ms: int | None) -> tuple[Any, ...]:
    """``append``'s arguments as ``append_fields``'s, in its order; the timestamp now if None.
    Strings are kept as str (no encode here, no decode later). Raises ValueError."""
    # isinstance would take a str subclass, which bytes() refuses: ``type(x) is str`` keeps that
    # refusal, and does not narrow (each ignore below: x is bytes-like in the else branch).
    t = topic if type(topic) is str else bytes(topic).decode()  # type: ignore[arg-type]  # bytes-like
    c = client_id if type(client_id) is str else bytes(client_id).decode()  # type: ignore[arg-type]  # bytes-like
    o = origin_router if origin_router is None or type(origin_router) is str \
        else bytes(origin_router).decode()  # type: ignore[arg-type]  # bytes-like
    if (qos.__class__ is not int or not 0 <= qos <= 2 or len(t) > 0x3FFF or len(c) > 0x3FFF
            or (o is not None and len(o) > 0x3FFF)
            or len(payload) > 0xFFFFFFFF or len(properties) > 0xFFFFFFFF):
        # Rare: measure the strings in UTF-8 (a character takes at most 4 bytes, so shorter
        # strings cannot pass the 65535-byte limit) and raise what is wrong.
        check(qos, (len(t.encode()), len(c.encode()), len((o or "").encode())),
              (len(properties), len(payload)))
    return (_time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms,
            o, origin_offset, c, t, int(qos), bool(retain), bytes(properties), bytes(payload))


def from_bytes(topic: bytes, payload: bytes, qos: int, retain: bool, client_id: bytes, properties: bytes,
               timestamp_ms: int, origin_router: bytes | None, origin_offset: int | None) -> tuple[Any, ...]:
    """``append_bytes``'s arguments (strings as UTF-8 bytes) as ``append_fields``'s. Raises ValueError."""
    check(qos, (len(topic), len(client_id), 0 if origin_router is None else len(origin_router)),
          (len(properties), len(payload)))
    return (timestamp_ms, None if origin_router is None else bytes(origin_router).decode(),
            origin_offset, bytes(client_id).decode(), bytes(topic).decode(), int(qos),
            bool(retain), bytes(properties), bytes(payload))


def check(qos: int, strings: tuple[int, ...], blobs: tuple[int, ...]) -> None:
    """The limits version 1 has in its header (and MQTT has anyway), kept so a log's appends take
    the same values whatever version wrote its older segments; given the fields' byte lengths.
    Raises ValueError."""
    if qos not in (0, 1, 2):
        raise ValueError(f"qos must be 0, 1 or 2, not {qos!r}")
    if any(n > 0xFFFF for n in strings) or any(n > 0xFFFFFFFF for n in blobs):
        raise ValueError("record field out of range (strings are at most 65535 bytes, properties "
                         "and payload under 4 GiB)")
