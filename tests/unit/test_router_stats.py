"""RouterStats: each counter declared once, as an annotation that is also its slot."""

import pytest

from brokerd.router.stats import LIMITS, RouterStats

pytestmark = pytest.mark.unit


def test_every_declared_counter_is_a_slot_that_starts_at_zero() -> None:
    stats = RouterStats()
    assert stats.__slots__ == tuple(RouterStats.__annotations__)
    assert all(getattr(stats, name) == 0 for name in stats.__slots__)


def test_every_limit_has_its_counter() -> None:
    assert {f"limit_{name}" for name in LIMITS} <= set(RouterStats.__slots__)


def test_a_counter_not_declared_cannot_be_set() -> None:
    with pytest.raises(AttributeError):
        RouterStats().not_a_counter = 1  # type: ignore[attr-defined]
