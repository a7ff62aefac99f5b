"""Topic names, topic filters, and the index that matches one against the other.

The same ``TopicIndex`` serves two purposes: a router's local subscriptions (filter → client
sessions) and its view of the other routers' interest (filter → router ids). Matching walks a trie of
topic levels, so its cost depends on the depth of the topic and the number of matching wildcards,
not on the number of subscriptions; results are cached per topic because device fleets publish to
the same topics again and again. Any change to the index drops the cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from sys import intern
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

MAX_TOPIC_BYTES = 65535
_CACHE_LIMIT = 65536
# The per-topic caches (this index's matches, the router's folded routes and peers, the shared
# groups' routes) keep topics up to this many characters (AWS IoT's limit on a topic's length);
# a longer one is matched each time. A topic may have 65,535 bytes, and a client publishing to
# distinct long topics nobody reads made every cache hold them: 65,536 of 64 KiB, 4 GiB a cache.
CACHED_TOPIC_MAX = 256


def remember(cache: dict[str, V], topic: str, value: V) -> None:
    """``value`` kept in ``cache`` for ``topic``, the one rule of every per-topic cache: a topic
    up to ``CACHED_TOPIC_MAX`` characters, and a full cache (``_CACHE_LIMIT`` topics) emptied
    first."""
    if len(topic) > CACHED_TOPIC_MAX:
        return
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[topic] = value


def valid_topic_name(topic: str) -> bool:
    """A topic a PUBLISH may name: non-empty, no wildcards (MQTT-3.3.2-2), fits a UTF-8 string."""
    if not topic or "+" in topic or "#" in topic or "\x00" in topic:
        return False
    return len(topic) <= MAX_TOPIC_BYTES // 4 or len(topic.encode()) <= MAX_TOPIC_BYTES


def valid_topic_filter(topic_filter: str) -> bool:
    """A filter a SUBSCRIBE may name (MQTT 4.7.1): '#' only alone as the last level, '+' alone."""
    if not topic_filter or "\x00" in topic_filter or len(topic_filter.encode()) > MAX_TOPIC_BYTES:
        return False
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != last):
            return False
        if "+" in level and level != "+":
            return False
    return True


def filter_matches(topic_filter: str, topic: str) -> bool:
    """Whether one filter matches one topic: the reference the trie is tested against."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    for i, f in enumerate(f_levels):
        if f == "#":
            return True
        if i >= len(t_levels):
            return False
        if f != "+" and f != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)


_WILDCARDS = ("+", "#")


class _Node(Generic[K, V]):
    """One level of a filter, or a chain of literal levels where each has one child (``chain``: the
    levels after the first, which is its key in the parent; ``span``: how many), so that a deep
    filter costs one node, not a node and two dicts per level (44 KB for 127 levels before:
    docs/tuning.md). '+' and '#' are always nodes of their own: a match compares a chain as a string.
    A chain split by a filter since removed stays split (merging would cost every removal a walk)."""

    __slots__ = ("children", "entries", "chain", "span")

    def __init__(self) -> None:
        self.children: dict[str, _Node[K, V]] | None = None  # None until it has one
        self.entries: dict[K, V] | None = None
        self.chain: str | None = None
        self.span = 0


class TopicIndex(Generic[K, V]):
    """Filters → {key: value}; ``match(topic)`` lists every (key, value) whose filter matches.

    A key appears once per matching filter; callers that need "once per key" (overlapping
    subscriptions of one client) fold the list themselves, which keeps this class generic.
    """

    def __init__(self) -> None:
        self._root: _Node[K, V] = _Node()
        self._root.children = {}
        self._cache: dict[str, list[tuple[K, V]]] = {}
        self._stack: list[Any] = []  # match's pending '+' branches; empty between calls
        self.filters = 0  # number of (filter, key) entries

    def add(self, topic_filter: str, key: K, value: V) -> bool:
        """Add or replace; True if the (filter, key) pair is new."""
        levels = topic_filter.split("/")
        n = len(levels)
        node = self._root
        i = 0
        while i < n:
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(levels[i])
            if child is None:
                child = children[intern(levels[i])] = _new_node(levels, i)
            elif child.span:
                own = child.chain.split("/")  # type: ignore[union-attr]  # a node with a span has a chain
                j = 0
                while j < child.span and i + 1 + j < n and levels[i + 1 + j] == own[j]:
                    j += 1
                if j < child.span:  # the filter leaves (or ends inside) the chain: split it there
                    _split(child, own, j)
            i += 1 + child.span
            node = child
        entries = node.entries
        if entries is None:
            entries = node.entries = {}
        new = key not in entries
        entries[key] = value
        if new:
            self.filters += 1
        self._cache.clear()
        return new

    def _find(self, topic_filter: str, path: list[tuple[_Node[K, V], str]] | None = None) -> _Node[K, V] | None:
        """The node ending at ``topic_filter`` (None: none does); ``path`` gets (parent, key) on the way."""
        levels = topic_filter.split("/")
        n = len(levels)
        node = self._root
        i = 0
        while i < n:
            children = node.children
            child = children.get(levels[i]) if children else None
            if child is None:
                return None
            span = child.span
            if span and (i + span >= n or "/".join(levels[i + 1:i + 1 + span]) != child.chain):
                return None
            if path is not None:
                path.append((node, levels[i]))
            node = child
            i += 1 + span
        return node

    def remove(self, topic_filter: str, key: K) -> bool:
        """Remove one (filter, key) pair and prune empty branches; True if it was there."""
        path: list[tuple[_Node[K, V], str]] = []
        node = self._find(topic_filter, path)
        if node is None or not node.entries or key not in node.entries:
            return False
        del node.entries[key]
        if not node.entries:
            node.entries = None
        self.filters -= 1
        for parent, level in reversed(path):
            child = parent.children[level]  # type: ignore[index]  # a parent on the path has children
            if child.entries or child.children:
                break
            del parent.children[level]  # type: ignore[union-attr]  # as above
        self._cache.clear()
        return True

    def get(self, topic_filter: str, key: K) -> V | None:
        node = self._find(topic_filter)
        if node is None or not node.entries:
            return None
        return node.entries.get(key)

    def match(self, topic: str) -> list[tuple[K, V]]:
        """Every (key, value) of every filter matching ``topic``; cached per topic (up to
        ``CACHED_TOPIC_MAX`` characters)."""
        hit = self._cache.get(topic)
        if hit is not None:
            return hit
        out = self._walk(topic)
        remember(self._cache, topic, out)
        return out

    def _walk(self, topic: str) -> list[tuple[K, V]]:
        """The uncached match: a loop, not recursion, for a topic may be deeper than Python's
        recursion limit (the codec's --max-topic-levels guards the broker, but this class holds
        whatever it is given). Its own method so that the cache hit's frame stays small.

        It follows the exact level in place and keeps '+' branches for later on a reused stack
        (node and level pushed flat: no tuple per branch), which visits the nodes in the order
        the recursive walk did: '#' of a level, then the exact branch in full, then '+'.
        """
        out: list[tuple[K, V]] = []
        levels = topic.split("/")
        n = len(levels)
        stack = self._stack
        if stack:  # left over only if a walk was interrupted (MemoryError ...): never reuse it
            stack.clear()
        node = self._root
        i = 0
        wild_ok = topic[:1] != "$"  # no leading wildcard matches a '$' topic (MQTT-4.7.2-1)
        while True:
            children = node.children
            if i == n:
                if children:
                    hash_node = children.get("#")  # "a/#" matches "a" too
                    if hash_node is not None and hash_node.entries:
                        out.extend(hash_node.entries.items())
                if node.entries:
                    out.extend(node.entries.items())
            elif children:
                if wild_ok:
                    hash_node = children.get("#")
                    if hash_node is not None and hash_node.entries:
                        out.extend(hash_node.entries.items())
                    plus = children.get("+")
                    if plus is not None:
                        stack.append(plus)
                        stack.append(i + 1)
                else:
                    wild_ok = True  # only the first level of a '$' topic is hidden
                exact = children.get(levels[i])
                if exact is not None:
                    span = exact.span
                    if not span:
                        node = exact
                        i += 1
                        continue
                    if i + span < n and "/".join(levels[i + 1:i + 1 + span]) == exact.chain:
                        node = exact
                        i += 1 + span
                        continue
            if not stack:
                return out
            i = stack.pop()
            node = stack.pop()

    def items(self) -> Iterator[tuple[str, K, V]]:
        """Every (filter, key, value), for snapshots and for announcing interest to a new peer."""
        stack: list[tuple[str, _Node[K, V]]] = [("", self._root)]
        while stack:
            prefix, node = stack.pop()
            for key, value in (node.entries or {}).items():
                yield prefix, key, value
            for level, child in (node.children or {}).items():
                if child.span:
                    level = f"{level}/{child.chain}"
                stack.append((level if node is self._root else f"{prefix}/{level}", child))

    def __len__(self) -> int:
        return self.filters


def _new_node(levels: list[str], i: int) -> _Node:
    """A node for ``levels[i]`` and the literal levels after it, up to the next wildcard."""
    node: _Node = _Node()
    if levels[i] in _WILDCARDS:
        return node
    end = i + 1
    n = len(levels)
    while end < n and levels[end] not in _WILDCARDS:
        end += 1
    if end > i + 1:
        node.chain = "/".join(levels[i + 1:end])
        node.span = end - i - 1
    return node


def _split(node: _Node, own: list[str], j: int) -> None:
    """Keep the first ``j`` levels of ``node``'s chain (``own``) in it; the rest becomes its only child,
    which takes its children and entries."""
    tail: _Node = _Node()
    tail.children = node.children
    tail.entries = node.entries
    rest = own[j + 1:]
    if rest:
        tail.chain = "/".join(rest)
        tail.span = len(rest)
    node.children = {intern(own[j]): tail}
    node.entries = None
    node.chain = "/".join(own[:j]) if j else None
    node.span = j
