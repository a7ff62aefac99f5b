"""RouterStats: each counter declared once, a field of a slotted dataclass (compiled: a native class)."""

from dataclasses import fields

import pytest

from brokerd.router.stats import LIMITS, RouterStats

pytestmark = pytest.mark.unit


def test_every_declared_counter_is_a_slot_that_starts_at_zero() -> None:
    stats = RouterStats()
    names = [f.name for f in fields(RouterStats)]
    assert len(names) > 30 and all(f.type in ("int", int) for f in fields(RouterStats))
    assert all(getattr(stats, name) == 0 for name in names)


def test_every_limit_has_its_counter() -> None:
    assert {f"limit_{name}" for name in LIMITS} <= {f.name for f in fields(RouterStats)}


def test_a_counter_not_declared_cannot_be_set() -> None:
    with pytest.raises(AttributeError):
        RouterStats().not_a_counter = 1  # type: ignore[attr-defined]
