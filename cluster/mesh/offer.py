"""Takeover offers, the pure rules: which copy of a session is taken when several are offered,
and which replicas' copies that passes over. An offer is ``(router, request, session state)``:
``router`` None for this router's own replica; a state with ``replica`` is a copy a follower
holds for a silent router (``stale_replicas``: others it knows are older).

A copy a live router offers is the session, the most recent (``recency``: the highest ownership
epoch, then arrival) where there are two (a partition that healed before the fence reached the
side cut off); among replicas' copies, the most recent. Where the session's agreed owner is known
(``--agreement``), the copy it offers, or a replica's copy of its session, comes first: a live
router that is not the owner holds a stale copy, whose move the agreement would refuse (partition
seed 315: the connect was refused until the silent owner was heard again). The asking router's
own replica of the owner's session counts as an offer too (``takes_own_replica``): beside one
stale live copy it is the one taken. ``takeover._settle`` acts on the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from brokerd.router.session import recency

Offer = tuple[str | None, int, dict[str, Any]]


def live(offers: list[Offer]) -> list[Offer]:
    """The offers of live routers: each is the session itself, not a replica's copy."""
    return [o for o in offers if not o[2].get("replica")]


def newest(offers: list[Offer]) -> Offer:
    """The offer with the most recent copy."""
    return max(offers, key=lambda o: recency(o[2]))


def source(o: Offer) -> str | None:
    """The router whose session an offer is: the silent router whose replica's copy it is, else
    the live router that offered it (None: none, for a copy of no router's)."""
    replica: str | None = o[2].get("replica")
    return replica or o[0]


def choose(offers: list[Offer], agreed: str | None = None) -> Offer:
    """The offer taken: the most recent live router's copy, else the most recent replica's copy;
    of the agreed owner's copies alone (``agreed``; None: not known), where it or a replica of it
    offered one."""
    if agreed is not None:
        owners = [o for o in offers if source(o) == agreed]
        if owners:
            offers = owners
    return newest(live(offers) or offers)


def takes_own_replica(offers: list[Offer], agreed: str | None, held: Callable[[], list[str]]) -> bool:
    """Whether the asking router's own replica copy joins the offers: where no live router
    offered the session, or where the agreed owner is a silent router whose session it holds
    (``held``: those routers, asked only then) and no offer is that owner's copy: then that
    copy is the one ``choose`` takes, not a stale live one the agreement would refuse."""
    if not live(offers):
        return True
    return agreed is not None and not any(source(o) == agreed for o in offers) and agreed in held()


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
