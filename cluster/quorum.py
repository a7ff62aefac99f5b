"""The cluster's members as one node knows them, and whether it sees a majority of them
(issue 19, step 2 without Raft; docs/replication.md, "A node cut off from the majority").

Why a majority: a node cannot tell a dead peer from one it cannot reach. If both sides of a
partition went on acknowledging and serving sessions, each would take the other's sessions for
dead and serve them too. A side that sees more than half of the members is the only one that
can; a node that sees half or fewer stops acknowledging QoS 1/2 and takes no session in.

Members are the nodes this node has heard, kept on disk (``members``, beside its log) so that a
node restarted inside a minority still knows it is one. A member silent long enough for the mesh
to forget it (``--mesh-forget``) leaves the set, but only while this node sees a majority: a
minority never shrinks the set until it looks like a majority. With fewer than three members
there is no majority to lose without losing the cluster (two nodes cannot tell a death from a
partition): the rule then does not apply, and a node alone goes on, as before.
"""

from __future__ import annotations

import json
import logging
import os

log = logging.getLogger(__name__)

MEMBERS_FILE = "members"
MIN_MEMBERS = 3  # below this, a node alone cannot be told from a partition: the rule is off


class Members:
    """The member nodes (persisted) and the majority rule over them. No sockets: the caller
    says which nodes it hears (``heard``) and which the mesh forgot (``forgotten``)."""

    def __init__(self, path: str, own: str) -> None:
        self.path = path
        self.own = own
        self.nodes: set[str] = {own}
        try:
            with open(path, encoding="utf-8") as f:
                self.nodes.update(n for n in json.load(f) if isinstance(n, str))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.error("cluster members file %s unreadable (%s): starting from the nodes heard", path, exc)
        self.has_majority = True

    def met(self, live: set[str]) -> None:
        """Nodes heard while this one is starting, before the majority is judged (their HELLOs
        may still be on the way): they become members at once. Counted only from the end of
        the start, they would be missing from the set of a node whose peers all went away
        within its first seconds: it would then see itself as the whole cluster."""
        if live - self.nodes:
            self.nodes |= live
            self._save()

    def update(self, live: set[str], forgotten: set[str]) -> bool | None:
        """The nodes heard now (``live``) and those the mesh forgot: returns the new majority
        state when it changed (True: regained, False: lost), else None."""
        live = live | {self.own}
        changed = bool(live - self.nodes)
        self.nodes |= live
        majority = self._majority(live)
        gone = (forgotten & self.nodes) - live
        if majority and gone:
            self.nodes -= gone
            changed = True
            log.warning("cluster: node(s) %s silent beyond --mesh-forget: no longer counted as members (%d "
                        "left)", ", ".join(sorted(gone)), len(self.nodes))
        if changed:
            self._save()
        if majority == self.has_majority:
            return None
        self.has_majority = majority
        return majority

    def _majority(self, live: set[str]) -> bool:
        if len(self.nodes) < MIN_MEMBERS:
            return True
        return 2 * len(live & self.nodes) > len(self.nodes)

    def _save(self) -> None:
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(sorted(self.nodes), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("cannot write the cluster members file %s: %s", self.path, exc)
