"""Whose a session is: the identity that made it (its user name, or the certificate identity that
``--use-identity-as-username`` makes the user name), and what a CONNECT of another identity with
its client id gets (``--session-owner``).

A client id is chosen by the client, so it proves nothing: without this rule any user could
resume another's session and be handed its queued, in-flight and shared-subscription messages.
The rule is sans-IO: ``decide`` decides; ``router.client`` acts on it for a session here, and
for one elsewhere the takeover request carries the claim (``[user name, refuse?]``), so that the
router holding the session refuses before it closes its owner's connection or lets the session
go (``Router.claim_refused``), and the asker checks what replicas offer (``refused_by``).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

REFUSE = "refuse"  # the default: CONNACK not authorized; the session stays, untouched
REPLACE = "replace"  # the new identity gets a clean session; the old one ends (logged)
POLICIES = (REFUSE, REPLACE)


class Claim(Enum):
    """What a CONNECT gets of an existing session with its client id."""

    RESUME = "resume"  # the same identity: the session is its own
    REFUSE = "refuse"  # another identity, refused
    REPLACE = "replace"  # another identity (or an unknown owner): a clean session instead


def decide(owner_known: bool, owner: str | None, claimant: str | None, policy: str) -> Claim:
    """The answer for ``claimant`` (a user name, None: anonymous) to a session of ``owner``.

    An owner that is not known (a session kept by a version that did not record it) is replaced
    whatever the policy: refusing would lock its client id out for good, since no identity can
    show it is the owner, and resuming could hand its messages to anyone. Its pending messages
    are the price, paid once."""
    if not owner_known:
        return Claim.REPLACE
    if owner == claimant:
        return Claim.RESUME
    return Claim.REFUSE if policy == REFUSE else Claim.REPLACE


def state_owner(state: dict) -> tuple[bool, str | None]:
    """(known, user name) of a session as exported or kept (``Session.export_header``, the
    snapshot): an absent ``username`` key means an unknown owner, a None value an anonymous one."""
    return "username" in state, state.get("username")


REFUSED = "refused"  # the key of a takeover's answer that refuses the claim: [owner, router]


def refusal(owner: str | None, where: str | None) -> dict:
    """What ``MeshPort.takeover`` answers when the session is another identity's."""
    return {REFUSED: [owner, where]}


def refused_by(claim: list | None, state: dict, where: str | None) -> dict | None:
    """``refusal`` when ``state`` (a session offered for takeover) is not the claimant's to take
    (``claim``: ``[user name, refuse?]``, None: no claim made), else None."""
    if claim is None or not claim[1]:
        return None
    known, owner = state_owner(state)
    return refusal(owner, where) if decide(known, owner, claim[0], REFUSE) is Claim.REFUSE else None


def name(user: Any) -> str:
    """A user name for a log line (never a password: only names reach here)."""
    return "anonymous" if user is None else repr(user)
