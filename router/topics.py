"""Topic names, topic filters, and the index that matches one against the other.

The same ``TopicIndex`` serves two purposes: a router's local subscriptions (filter → client
sessions) and its view of the other routers' interest (filter → router ids). Matching walks a trie of
topic levels, so its cost depends on the depth of the topic and the number of matching wildcards,
not on the number of subscriptions; results are cached per topic because device fleets publish to
the same topics again and again. Any change to the index drops the cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

MAX_TOPIC_BYTES = 65535
_CACHE_LIMIT = 65536


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


class _Node(Generic[K, V]):
    __slots__ = ("children", "entries")

    def __init__(self) -> None:
        self.children: dict[str, _Node[K, V]] = {}
        self.entries: dict[K, V] = {}


class TopicIndex(Generic[K, V]):
    """Filters → {key: value}; ``match(topic)`` lists every (key, value) whose filter matches.

    A key appears once per matching filter; callers that need "once per key" (overlapping
    subscriptions of one client) fold the list themselves, which keeps this class generic.
    """

    def __init__(self) -> None:
        self._root: _Node[K, V] = _Node()
        self._cache: dict[str, list[tuple[K, V]]] = {}
        self._stack: list[Any] = []  # match's pending '+' branches; empty between calls
        self.filters = 0  # number of (filter, key) entries

    def add(self, topic_filter: str, key: K, value: V) -> bool:
        """Add or replace; True if the (filter, key) pair is new."""
        node = self._root
        for level in topic_filter.split("/"):
            nxt = node.children.get(level)
            if nxt is None:
                nxt = node.children[level] = _Node()
            node = nxt
        new = key not in node.entries
        node.entries[key] = value
        if new:
            self.filters += 1
        self._cache.clear()
        return new

    def remove(self, topic_filter: str, key: K) -> bool:
        """Remove one (filter, key) pair and prune empty branches; True if it was there."""
        path: list[tuple[_Node[K, V], str]] = []
        node = self._root
        for level in topic_filter.split("/"):
            nxt = node.children.get(level)
            if nxt is None:
                return False
            path.append((node, level))
            node = nxt
        if key not in node.entries:
            return False
        del node.entries[key]
        self.filters -= 1
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.entries or child.children:
                break
            del parent.children[level]
        self._cache.clear()
        return True

    def get(self, topic_filter: str, key: K) -> V | None:
        node = self._root
        for level in topic_filter.split("/"):
            node = node.children.get(level)  # type: ignore[assignment]
            if node is None:
                return None
        return node.entries.get(key)

    def match(self, topic: str) -> list[tuple[K, V]]:
        """Every (key, value) of every filter matching ``topic``; cached per topic."""
        hit = self._cache.get(topic)
        if hit is not None:
            return hit
        out = self._walk(topic)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[topic] = out
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
                    if hash_node is not None:
                        out.extend(hash_node.entries.items())
                if node.entries:
                    out.extend(node.entries.items())
            elif children:
                if wild_ok:
                    hash_node = children.get("#")
                    if hash_node is not None:
                        out.extend(hash_node.entries.items())
                    plus = children.get("+")
                    if plus is not None:
                        stack.append(plus)
                        stack.append(i + 1)
                else:
                    wild_ok = True  # only the first level of a '$' topic is hidden
                exact = children.get(levels[i])
                if exact is not None:
                    node = exact
                    i += 1
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
            for key, value in node.entries.items():
                yield prefix, key, value
            for level, child in node.children.items():
                stack.append((level if node is self._root else f"{prefix}/{level}", child))

    def __len__(self) -> int:
        return self.filters
