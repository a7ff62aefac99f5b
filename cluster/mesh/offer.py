"""Takeover offers, the pure rules: which copy of a session is taken when several are offered,
and which replicas' copies that passes over. An offer is ``(router, request, session state)``:
``router`` None for this router's own replica; a state with ``replica`` is a copy a follower
holds for a silent router (``stale_replicas``: others it knows are older).

A copy a live router offers is the session, the most recent (``recency``: the highest ownership
epoch, then arrival) where there are two (a partition that healed before the fence reached the
side cut off); among replicas' copies, the most recent. ``takeover._settle`` acts on the answer.
"""

from __future__ import annotations

from typing import Any

from brokerd.router.session import recency

Offer = tuple[str | None, int, dict[str, Any]]


def live(offers: list[Offer]) -> list[Offer]:
    """The offers of live routers: each is the session itself, not a replica's copy."""
    return [o for o in offers if not o[2].get("replica")]


def newest(offers: list[Offer]) -> Offer:
    """The offer with the most recent copy."""
    return max(offers, key=lambda o: recency(o[2]))


def passed_over(offers: list[Offer], chosen: dict[str, Any]) -> list[str]:
    """The silent routers whose replicas' copies are older than ``chosen`` (to be fenced): those
    offered and not taken, and those each replica offered knew to be older."""
    stale: list[str] = []
    for _rid, _req, state in offers:
        if state.get("replica"):
            stale += state.get("stale_replicas", ())
            if state is not chosen:
                stale.append(state["replica"])
    return stale
