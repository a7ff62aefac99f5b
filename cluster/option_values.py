"""What an option's value may be: the converters that read one from text (the command line, a
``BROKERD_*`` variable) or from TOML's own types, and the checks that a converted value is in range.

One home for both, apart from the option table (``cluster.config.OPTIONS``) that names them per
option and from ``cluster.options_doc``, which shows each type's values as an operator writes them.
A converter raises ``ValueError`` (``config`` turns it into a ``ConfigError`` that names the option,
in the words of ``EXPECTED``); a check returns the error's text, or None.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT``; an IPv6 host in brackets, an empty host the wildcard."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():  # the port's range is the option's check (address)
        raise ValueError("expected HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


AGREEMENT_OFF = ("off", 0)  # ``--agreement off``: the operator's explicit choice of the lease rules


def host_port_or_off(value: str) -> tuple[str, int]:
    """``--agreement`` takes an address or, said in so many words, ``off``."""
    return AGREEMENT_OFF if value.strip().lower() == "off" else host_port(value)


def agreement_address(v: tuple[str, int]) -> str | None:
    return None if v == AGREEMENT_OFF else address(v)


def size(value: str | int) -> int:
    """Sizes accept plain bytes or a K/M/G suffix (powers of 1024): '64M', '1G'."""
    if isinstance(value, int):
        return value
    v = value.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(v[-1:], 1)
    if mult != 1:
        v = v[:-1]
    return int(float(v) * mult)


def word(value: str) -> str:
    """A choice as typed, in any case: ``--log-level DEBUG`` is ``debug``."""
    return str(value).strip().lower()


# What a value of each type looks like, for errors in an operator's words (not "invalid literal for int()").
EXPECTED: dict[Any, str] = {int: "expected a whole number", float: "expected a number",
                             size: "expected a size in bytes, such as 65536, 64M or 1G"}


def on_off(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    v = value.lower()
    if v in ("on", "true", "yes", "1"):
        return True
    if v in ("off", "false", "no", "0"):
        return False
    raise ValueError("expected on or off")


def at_least(n: int) -> Callable[[Any], str | None]:
    return lambda v: None if v >= n else f"must be at least {n}"


def port_number(v: int) -> str | None:
    """A TCP port a broker binds or connects to (0 would be a random one nobody can find)."""
    return None if 1 <= v <= 65535 else "must be a port number (1-65535)"


def address(v: tuple[str, int]) -> str | None:
    return port_number(v[1])


def positive(v: float) -> str | None:
    return None if math.isfinite(v) and v > 0 else "must be positive"
