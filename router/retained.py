"""Retained messages: one per topic, found by walking a trie of topic levels with a filter.

Subscribing to ``sensors/+/temp`` must find retained messages without scanning every retained topic,
so topics are stored level by level and the filter walks the trie ('+' fans out one level, '#' takes
the whole subtree, '$' topics are hidden from a leading wildcard as in subscriptions).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from .message import Message

SYS_PREFIX = "$SYS/"  # the broker's own topics (router.sys_topics)
TOMBSTONES = 100_000  # cleared topics whose clearing is remembered (to order late updates), newest kept


def version(msg: Message) -> tuple[int, str]:
    """The order of two versions of a topic's retained message, the same on every router: its
    stamp (the publish time, raised past the version it replaced where the publisher's router
    had seen a newer one: a per-topic hybrid logical clock), then its origin router's id to
    break a tie. Every router keeps the highest version whatever order updates arrive in, so all
    converge on one value (MQTT leaves concurrent retained updates unordered; a cluster should
    not disagree about them)."""
    return msg.timestamp_ms, msg.origin_router or ""


class _Node:
    __slots__ = ("children", "msg", "seq")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.msg: Message | None = None
        self.seq = 0  # RetainedStore.local_seq when a publish on this router set it; 0 otherwise


class RetainedStore:
    def __init__(self, stats: Any = None) -> None:
        self._root = _Node()
        self.count = 0
        self.bytes = 0  # topics and payloads held (--max-retained-bytes)
        # Of those, the broker's own ``$SYS/`` topics: not the clients' quota (``limits.may_retain``).
        self.sys_count = 0
        self.sys_bytes = 0
        self.stats = stats  # RouterStats: expired messages found are counted in drop_expired
        # Counts the retained messages set by publishes on this router. A subscription is live on
        # its router before its SUBACK (which may wait for the other routers): what a publish here
        # retained after that moment was delivered to it live, so ``match(..., live_after=mark)``
        # leaves it out of the retained messages sent with the SUBACK (else it arrives twice).
        self.local_seq = 0
        # Cleared topics: {topic: the version of the clearing}, so a set that the clear
        # superseded and that arrives late does not bring the topic back (bounded: TOMBSTONES).
        self.cleared: OrderedDict[str, tuple[int, str]] = OrderedDict()

    def set(self, msg: Message, local: bool = False) -> None:
        """Store ``msg`` for its topic; an empty payload clears it (MQTT-3.3.1-10/11). ``local``:
        published on this router (not a peer's update, not restored from disk)."""
        if not msg.payload:
            cleared = self.cleared
            cleared[msg.topic] = version(msg)
            cleared.move_to_end(msg.topic)
            if len(cleared) > TOMBSTONES:
                cleared.popitem(last=False)
            self.clear(msg.topic)
            return
        node = self._root
        for level in msg.topic.split("/"):
            nxt = node.children.get(level)
            if nxt is None:
                nxt = node.children[level] = _Node()
            node = nxt
        size = len(msg.topic) + len(msg.payload)
        sys = msg.topic.startswith(SYS_PREFIX)
        if node.msg is None:
            self.count += 1
            self.sys_count += sys
        else:
            old = len(node.msg.topic) + len(node.msg.payload)
            self.bytes -= old
            if sys:
                self.sys_bytes -= old
        self.bytes += size
        if sys:
            self.sys_bytes += size
        node.msg = msg
        if local:
            self.local_seq += 1
            node.seq = self.local_seq
        else:
            node.seq = 0

    def clear(self, topic: str) -> None:
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in topic.split("/"):
            nxt = node.children.get(level)
            if nxt is None:
                return
            path.append((node, level))
            node = nxt
        if node.msg is None:
            return
        size = len(node.msg.topic) + len(node.msg.payload)
        self.bytes -= size
        if topic.startswith(SYS_PREFIX):
            self.sys_count -= 1
            self.sys_bytes -= size
        node.msg = None
        self.count -= 1
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.msg is not None or child.children:
                break
            del parent.children[level]

    def current_version(self, topic: str) -> tuple[int, str] | None:
        """The version of what this router has for ``topic``: its retained message's, or its
        clearing's (None: never seen, or forgotten)."""
        msg = self.get(topic)
        if msg is not None:
            return version(msg)
        return self.cleared.get(topic)

    def newer(self, msg: Message) -> bool:
        """Whether ``msg`` (a peer's update) is newer than what this router has for its topic."""
        current = self.current_version(msg.topic)
        return current is None or version(msg) > current

    def stamp(self, msg: Message) -> None:
        """A publish on this router: raise its stamp past the version it replaces, if this
        router's clock is behind the router that set that one (the hybrid logical clock's rule),
        so the update is the newest on every router, as it is here."""
        current = self.current_version(msg.topic)
        if current is not None and version(msg) <= current:
            msg.timestamp_ms = current[0] + 1

    def get(self, topic: str) -> Message | None:
        node = self._root
        for level in topic.split("/"):
            node = node.children.get(level)  # type: ignore[assignment]
            if node is None:
                return None
        return node.msg

    def match(self, topic_filter: str, live_after: int | None = None) -> list[Message]:
        """Every retained message whose topic ``topic_filter`` matches; with ``live_after`` (a
        ``local_seq`` taken earlier) not those that publishes on this router set since then.

        A loop over a stack of (node, level index), not recursion: a filter (and the stored topics)
        may be deeper than Python's recursion limit, whatever limit the codec enforces. Children
        are pushed in reverse so they come off in insertion order, as the recursive walk had them.
        """
        out: list[Message] = []
        levels = topic_filter.split("/")
        n = len(levels)
        stack: list[tuple[_Node, int]] = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            if i == n:
                if node.msg is not None and (live_after is None or node.seq <= live_after):
                    out.append(node.msg)
                continue
            level = levels[i]
            if level == "#":
                # '#' also matches the parent level itself ("a/#" matches "a").
                if node.msg is not None and i > 0 and (live_after is None or node.seq <= live_after):
                    out.append(node.msg)
                for name, child in node.children.items():
                    if i == 0 and name.startswith("$"):
                        continue
                    self._all(child, out, live_after)
            elif level == "+":
                stack.extend(reversed([(child, i + 1) for name, child in node.children.items()
                                       if i or not name.startswith("$")]))
            else:
                child = node.children.get(level)
                if child is not None:
                    stack.append((child, i + 1))
        for msg in out:
            if msg.expires_ms and msg.expired():
                return self._drop_expired(out)
        return out

    def _drop_expired(self, found: list[Message]) -> list[Message]:
        """A retained message past its Message Expiry Interval is deleted when a match finds it
        (MQTT-3.3.2-5: no longer delivered), not by a timer per message."""
        out = []
        for msg in found:
            if msg.expires_ms and msg.expired():
                self.clear(msg.topic)
                if self.stats is not None:
                    self.stats.drop_expired += 1
            else:
                out.append(msg)
        return out

    def _all(self, node: _Node, out: list[Message], live_after: int | None = None) -> None:
        stack = [node]
        while stack:
            n = stack.pop()
            if n.msg is not None and (live_after is None or n.seq <= live_after):
                out.append(n.msg)
            stack.extend(n.children.values())

    def __iter__(self) -> Iterator[Message]:
        out: list[Message] = []
        self._all(self._root, out)
        return iter(out)

    def __len__(self) -> int:
        return self.count
