"""Hand-on's rules, without sockets or a clock: from which offset of each router's log a moved
session's messages reach its new owner directly (its marks), and which copies handed on by the
old owner that lets through.

A mark is an offset of one router's log (the origin of a message, ``values[5]`` of its mesh
form, with its offset in ``values[6]``): a copy from there on came to the new owner directly,
so the one handed on is a duplicate. ``handon`` acts on the answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def directly_from(seen: Iterable[tuple[str, int]], acked: list | None, own: tuple[str, int] | None
                  ) -> dict[str, int]:
    """The marks of a session confirmed here: ``seen``, each peer with how far this router has
    seen its log (-1: not at all); ``acked``, the results of the interest waits of the session's
    subscriptions, each {router: its log end when it took the announcement in} (None: nothing
    waited); ``own``, this router with its log's end (None without a log).

    A router that acknowledged every announcement: its end then (or how far it was seen, if
    further); where nothing was announced (the session's filters were this router's already):
    how far it is seen; a router that did not acknowledge, or any router where a wait timed
    out (a result that is not a dict): none, every copy counts."""
    marks: dict[str, int] = {}
    ends = [a for a in acked or () if a.__class__ is dict]
    if not acked or len(ends) == len(acked):
        for rid, mark in seen:
            if acked:
                if any(rid not in e for e in ends):
                    continue
                mark = max(mark, *(e[rid] for e in ends))
            if mark >= 0:
                marks[rid] = mark
    if own is not None:
        marks[own[0]] = own[1]
    return marks


def not_direct(items: list, marks: Mapping[str, int]) -> list:
    """The handed-on copies (``[qos, retain, mesh values]``) that did not also come here
    directly: from an origin without a mark, without an offset, or from before its mark."""
    kept: list[Any] = []
    for item in items:
        values = item[2]
        mark = marks.get(values[5])
        if mark is None or values[6] is None or values[6] < mark:
            kept.append(item)
    return kept


def named_unheard(answered: Iterable[str], peers: Iterable[tuple[str, int, bool]], new_owner: str,
                  young: bool) -> dict[str, int | None]:
    """What a session's old router names in its last SESSION_HANDON: {router: how far this router
    has seen its log, for one whose messages may still come here after the hand-on; None, for one
    that answered the barrier}. ``answered``: the routers that answered it; ``peers``: each with
    how far its log is seen here (``origin_mark``, -1: not at all) and whether frames of it may
    still come after those that followed them (``delivery.in_doubt``: missed here, or maybe lost
    with a connection while it was silent); ``new_owner``: the session's router now;
    ``young``: this incarnation has just restarted on its log.

    A router that answered sent its answer after what it had sent here, but a PUBLISH frame lost
    on the way (ZeroMQ drops what a replaced connection held) is sent again only once this router
    names it, after the answer and after the hand-on: it then matches nothing here (partition
    seeds 331 and 341: 8 and 11 lost so). So a router whose frames are missed here, or may be, is
    named with its mark, which is held below the gap (``delivery.first_receipt``), as one that did not
    answer: the new owner reads its log from there. That holds for the new owner too, whose own
    messages came here before the move (it reads them from its own log). A young incarnation
    names every other router from a time (-1): what they send it again may follow their answer
    (``Handons.hand_on``)."""
    seen = [(rid, mark, missed) for rid, mark, missed in peers if rid != new_owner or missed]
    if young:
        named: dict[str, int | None] = {rid: -1 for rid, mark, missed in seen if mark >= 0 or missed}
        named.update({rid: -1 for rid in answered if rid != new_owner})
        return named
    named = {rid: None for rid in answered if rid != new_owner}
    named.update({rid: mark for rid, mark, missed in seen if (missed or rid not in named) and (mark >= 0 or missed)})
    return named


def to_ask(named: Mapping[str, Any], known: Iterable[str], old: str) -> dict[str, int]:
    """The routers a session's new owner asks for what they sent its old router ``old`` before
    they knew of the move, with how far ``old`` had seen their logs (-1: nothing, asked from a
    time). ``named``: the last SESSION_HANDON's, {router: how far ``old`` had seen its log, for
    one that did not answer its barrier; None, for one that did}; ``known``: the new owner's
    peers with a log. Those that did not answer are asked, and so are those ``old`` names
    neither way: it had not heard them at all. A router that has just restarted hears the
    others one by one; what they send again to its new incarnation (frames its old one never
    confirmed, what they kept while it was silent) may reach it after the session left, past a
    barrier they were not asked to answer, and match nothing there (chaos seeds 1135298849 and
    1240224720 beside the CPU hog). At least once."""
    ask = {rid: mark for rid, mark in named.items() if mark.__class__ is int}
    for rid in known:
        if rid != old and rid not in named:
            ask[rid] = -1
    return ask
