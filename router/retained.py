"""Retained messages: one per topic, in a map by topic and in a trie of topic levels for filters.

Every retained publish looks its topic up (the limits, the version, the set): the map answers that
at once. Subscribing to ``sensors/+/temp`` must find retained messages without scanning every
retained topic, so topics are also stored level by level and the filter walks the trie ('+' fans
out one level, '#' takes the whole subtree, '$' topics are hidden from a leading wildcard as in
subscriptions). The trie is path-compressed and its level keys interned: a 127-level topic is one
node, not 127 nodes with a dict each (39 KB a message before: docs/tuning.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Generator, Iterator
from sys import intern
from typing import TYPE_CHECKING

from .clock import LOOP_CLOCK, Clock
from .message import Message

if TYPE_CHECKING:
    from .stats import RouterStats

SYS_PREFIX = "$SYS/"  # the broker's own topics (router.sys_topics)
TOMBSTONES = 100_000  # cleared topics whose clearing is remembered (to order late updates), newest kept
# ... and at most this many characters of their topics: a clear is always allowed and counts
# against no quota, so one client clearing distinct long topics that held nothing (up to 64 KiB
# each) would otherwise make every router hold 100,000 of them.
TOMBSTONE_CHARS = 8 << 20
PAUSE_NODES = 256  # a walk yields None after this many nodes without a match: a point to pause at


def version(msg: Message) -> tuple[int, str]:
    """The order of two versions of a topic's retained message, the same on every router: its
    stamp (the publish time, raised past the version it replaced where the publisher's router
    had seen a newer one: a per-topic hybrid logical clock), then its origin router's id to
    break a tie. Every router keeps the highest version whatever order updates arrive in, so all
    converge on one value (MQTT leaves concurrent retained updates unordered; a cluster should
    not disagree about them)."""
    return msg.timestamp_ms, msg.origin_router or ""


# What a retained message holds beyond its topic and payload, measured with scripts/measure_memory.py
# (CPython 3.11, 64-bit; docs/tuning.md): the Message object and its dict of encodings, its trie node
# (and the branch its insertion may split off), their level keys and dict entries, its entry in the map
# by topic. Rounded up. --max-retained-bytes counts all of it, not just the topic and payload (which
# undercounted a short topic 40 times, a 127-level one 74 times). Properties are estimated generously
# (a content type, two user properties and an expiry: 2.1 KB charged for a message that holds 1.7 KB).
MESSAGE_BYTES = 1024
# Copies held of the topic: the string, its UTF-8 bytes, two encodings (the packet as published, as
# sent to a subscriber with RETAIN set). Of the payload: the bytes and the same two encodings.
TOPIC_COPIES = 4
PAYLOAD_COPIES = 3
_OBJECT_BYTES = 56  # a str, bytes or int object's own header, rounded up
_ENTRY_BYTES = 40  # a property: the dict's entry and slack
_DICT_BYTES = 232  # the properties' dict


def _value_bytes(value: object) -> int:
    if isinstance(value, (str, bytes)):
        return _OBJECT_BYTES + len(value)
    if isinstance(value, (list, tuple)):
        return _OBJECT_BYTES + 8 * len(value) + sum(_value_bytes(v) for v in value)
    return _OBJECT_BYTES


def held_bytes(msg: Message) -> int:
    """The memory a retained ``msg`` takes in a router, as charged to --max-retained-bytes."""
    size = MESSAGE_BYTES + TOPIC_COPIES * len(msg.topic) + PAYLOAD_COPIES * len(msg.payload)
    props = msg.properties
    if props:
        size += _DICT_BYTES + sum(_ENTRY_BYTES + _value_bytes(v) for v in props.values())
    return size


class _Node:
    """A node of the trie: the end of one or more levels. A chain of levels with one child each
    (and no message between) is one node, so a deep topic costs one node, not one per level."""

    __slots__ = ("levels", "children", "msg", "seq")

    def __init__(self, levels: str) -> None:
        self.levels = levels  # the levels from the parent to here, joined by '/' (at least one)
        self.children: dict[str, _Node] | None = None  # by the first of their levels; None: a leaf
        self.msg: Message | None = None
        # RetainedStore.seq when it was set: positive for a publish on this router, negative else.
        self.seq = 0


class RetainedStore:
    """Every node other than the root holds a message or branches (two children or more): a
    clearing merges a branch left with one child into it. Restructuring waits while a walk is
    suspended (``iter_match`` consumed in slices), so the walk's pending nodes stay where it
    left them; new topics may come in meanwhile (a split keeps the end of the node split)."""

    def __init__(self, stats: RouterStats | None = None, clock: Clock = LOOP_CLOCK) -> None:
        self._root = _Node("")
        self._root.children = {}
        self._topics: dict[str, _Node] = {}  # topic → its node: the exact lookups of every publish
        self.count = 0
        self.bytes = 0  # held by the messages, ``held_bytes`` each (--max-retained-bytes)
        # Of those, the broker's own ``$SYS/`` topics: not the clients' quota (``limits.may_retain``).
        self.sys_count = 0
        self.sys_bytes = 0
        self.stats = stats  # RouterStats: expired messages found are counted in drop_expired
        self.clock = clock  # when a retained message has expired
        # Numbers every set. A subscription is live on its router before its SUBACK (which may
        # wait for the other routers): what a publish here retained after that moment was delivered
        # to it live, so ``match(..., live_after=mark)`` leaves it out of the retained messages sent
        # with the SUBACK (else it arrives twice); ``before`` leaves out every set since a mark.
        self.seq = 0
        # Cleared topics: {topic: the version of the clearing}, so a set that the clear
        # superseded and that arrives late does not bring the topic back (bounded: TOMBSTONES).
        self.cleared: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self.cleared_chars = 0  # the characters of ``cleared``'s topics (TOMBSTONE_CHARS)
        self._walks = 0  # iter_match generators open
        self._untidy: list[str] = []  # topics cleared while a walk was open: pruned once none is

    def set(self, msg: Message, local: bool = False) -> None:
        """Store ``msg`` for its topic; an empty payload clears it (MQTT-3.3.1-10/11). ``local``:
        published on this router (not a peer's update, not restored from disk)."""
        topic = msg.topic
        if not msg.payload:
            cleared = self.cleared
            if topic in cleared:
                cleared.move_to_end(topic)
            else:
                self.cleared_chars += len(topic)
            cleared[topic] = version(msg)
            while len(cleared) > TOMBSTONES or self.cleared_chars > TOMBSTONE_CHARS:
                self.cleared_chars -= len(cleared.popitem(last=False)[0])
            self.clear(topic)
            return
        size = held_bytes(msg)
        sys = topic.startswith(SYS_PREFIX)
        node = self._topics.get(topic)
        if node is None:
            node = self._topics[topic] = self._insert(topic)
            self.count += 1
            self.sys_count += sys
        else:
            old = node.msg
            assert old is not None
            msg.topic = old.topic  # the map's key: one string for the topic, not two
            old_size = held_bytes(old)
            self.bytes -= old_size
            if sys:
                self.sys_bytes -= old_size
        self.bytes += size
        if sys:
            self.sys_bytes += size
        node.msg = msg
        self.seq += 1
        node.seq = self.seq if local else -self.seq

    def _insert(self, topic: str) -> _Node:
        """The node ending at ``topic``, made where missing: a new leaf holds all the levels left,
        and a node whose chain the topic leaves (or ends inside) is split there."""
        levels = topic.split("/")
        n = len(levels)
        node = self._root
        i = 0
        while True:
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(levels[i])
            if child is None:
                leaf = children[intern(levels[i])] = _Node("/".join(levels[i:]) if i else topic)
                return leaf
            own = child.levels.split("/")
            m = len(own)
            k = 1
            while k < m and i + k < n and own[k] == levels[i + k]:
                k += 1
            if k < m:
                mid = children[levels[i]] = _Node("/".join(own[:k]))
                mid.children = {intern(own[k]): child}
                child.levels = "/".join(own[k:])
                child = mid
            i += k
            if i == n:
                return child
            node = child

    def clear(self, topic: str) -> None:
        node = self._topics.pop(topic, None)
        if node is None:
            return
        size = held_bytes(node.msg)  # type: ignore[arg-type]  # a topic's node holds one
        self.bytes -= size
        if topic.startswith(SYS_PREFIX):
            self.sys_count -= 1
            self.sys_bytes -= size
        node.msg = None
        self.count -= 1
        if self._walks:
            self._untidy.append(topic)
        else:
            self._tidy(topic)

    def _tidy(self, topic: str) -> None:
        """Prune the node of a cleared topic, and merge what is left a chain into one node."""
        path = self._path(topic)
        if path is None:
            return
        parent, key = path[-1]
        node = parent.children[key]  # type: ignore[index]  # on the path: has children
        if node.msg is not None:  # set again since
            return
        if node.children:
            if len(node.children) == 1:
                self._merge(parent, key, node)
            return
        del parent.children[key]  # type: ignore[union-attr]  # a parent on the path has children
        if len(path) > 1 and parent.msg is None and len(parent.children) == 1:  # type: ignore[arg-type]  # as above
            grand, parent_key = path[-2]
            self._merge(grand, parent_key, parent)

    @staticmethod
    def _merge(parent: _Node, key: str, node: _Node) -> None:
        """``node`` holds no message and has one child: the child takes its place and its levels."""
        (child,) = node.children.values()  # type: ignore[union-attr]  # one child
        child.levels = node.levels + "/" + child.levels
        parent.children[key] = child  # type: ignore[index]  # a parent has children

    def _path(self, topic: str) -> list[tuple[_Node, str]] | None:
        """(parent, key) of every node on the way to the node ending at ``topic`` (None: no such node)."""
        levels = topic.split("/")
        n = len(levels)
        path: list[tuple[_Node, str]] = []
        node = self._root
        i = 0
        while i < n:
            children = node.children
            child = children.get(levels[i]) if children else None
            if child is None:
                return None
            own = child.levels.split("/")
            if levels[i:i + len(own)] != own:
                return None
            path.append((node, levels[i]))
            i += len(own)
            node = child
        return path

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
        node = self._topics.get(topic)
        return None if node is None else node.msg

    def match(self, topic_filter: str, live_after: int | None = None) -> list[Message]:
        """Every retained message whose topic ``topic_filter`` matches; with ``live_after`` (a
        ``seq`` taken earlier) not those that publishes on this router set since then."""
        return [msg for msg in self.iter_match(topic_filter, live_after) if msg is not None]

    def iter_match(self, topic_filter: str, live_after: int | None = None,
                   before: int | None = None) -> Generator[Message | None, None, None]:
        """``match`` as a generator, to be consumed in slices across loop turns: it also yields
        None after every PAUSE_NODES nodes walked, so a slice bounds the walk as well as the
        messages. With ``before`` (a ``seq``) it leaves out whatever was set since, so a topic set
        meanwhile (delivered live) is not sent again. A message past its Message Expiry Interval
        is deleted when a walk finds it (MQTT-3.3.2-5: no longer delivered), not by a timer per
        message.

        A loop over a stack of (node, filter levels consumed at its end), not recursion: a filter
        (and the stored topics) may be deeper than Python's recursion limit."""
        self._walks += 1
        try:
            yield from self._walk(topic_filter.split("/"), live_after, before)
        finally:
            self._walks -= 1
            if not self._walks and self._untidy:
                untidy, self._untidy = self._untidy, []
                for topic in untidy:
                    self._tidy(topic)

    def _take(self, node: _Node, live_after: int | None, before: int | None) -> Message | None:
        msg = node.msg
        if msg is None:
            return None
        seq = node.seq
        if live_after is not None and seq > live_after:
            return None
        if before is not None and (seq if seq > 0 else -seq) > before:
            return None
        if msg.expires_ms and msg.expired(self.clock.unix() * 1000):
            self.clear(msg.topic)
            if self.stats is not None:
                self.stats.drop_expired += 1
            return None
        return msg

    def _walk(self, levels: list[str], live_after: int | None, before: int | None) -> Iterator[Message | None]:
        take = self._take
        n = len(levels)
        stack: list[tuple[_Node, int]] = [(self._root, 0)]
        walked = 0
        while stack:
            node, i = stack.pop()
            walked += 1
            if walked % PAUSE_NODES == 0:
                yield None
            if i == n:
                msg = take(node, live_after, before)
                if msg is not None:
                    yield msg
                continue
            level = levels[i]
            children = node.children
            if level == "#":
                # '#' also matches the parent level itself ("a/#" matches "a").
                if i:
                    msg = take(node, live_after, before)
                    if msg is not None:
                        yield msg
                if children:
                    for key, child in list(children.items()):
                        if i or not key.startswith("$"):
                            yield from self._subtree(child, live_after, before)
                continue
            if not children:
                continue
            if level == "+":  # no leading wildcard matches a '$' topic (MQTT-4.7.2-1)
                found = [child for key, child in children.items() if i or not key.startswith("$")]
            else:
                exact = children.get(level)
                found = [exact] if exact is not None else []
            below: list[tuple[_Node, int]] = []
            for child in found:
                if "/" not in child.levels:
                    below.append((child, i + 1))
                    continue
                own = child.levels.split("/")  # a chain: the filter's next levels against its own
                j = 1
                while j < len(own):
                    if i + j == n:  # the filter ends inside the chain
                        break
                    f = levels[i + j]
                    if f == "#":  # every topic below goes through here and on: all match
                        yield from self._subtree(child, live_after, before)
                        break
                    if f != "+" and f != own[j]:
                        break
                    j += 1
                else:
                    below.append((child, i + j))
            stack.extend(reversed(below))

    def _subtree(self, node: _Node, live_after: int | None, before: int | None) -> Iterator[Message | None]:
        take = self._take
        stack = [node]
        walked = 0
        while stack:
            n = stack.pop()
            walked += 1
            if walked % PAUSE_NODES == 0:
                yield None
            msg = take(n, live_after, before)
            if msg is not None:
                yield msg
            if n.children:
                stack.extend(n.children.values())

    def __iter__(self) -> Iterator[Message]:
        return iter([node.msg for node in self._topics.values()])  # type: ignore[misc]  # each holds one

    def __len__(self) -> int:
        return self.count
