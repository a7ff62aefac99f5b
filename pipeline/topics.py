"""MQTT topic filters turned into what Spark and Arrow can evaluate without a Python call per record.

The broker's own matcher (``router.topics.filter_matches``) is the definition of what a filter
matches; it works on one topic at a time, which would cost a Python call per record inside the data
source. ``filter_regex`` compiles a filter into one anchored RE2 pattern that Arrow
(``pyarrow.compute.match_substring_regex``) and Spark (``rlike``) evaluate over a whole column, with
the same semantics (tested against ``filter_matches``), including the rule that a filter starting
with a wildcard does not match topics starting with ``$``.
"""

from __future__ import annotations

import re

from brokerd.router.topics import valid_topic_filter


class TopicFilterError(ValueError):
    """A topic filter that a SUBSCRIBE could not name either."""


def check_filter(topic_filter: str) -> str:
    """Return the filter if it is a valid MQTT filter, else raise TopicFilterError (naming it)."""
    if not valid_topic_filter(topic_filter):
        raise TopicFilterError(
            f"invalid MQTT topic filter {topic_filter!r}: '+' must be a whole level, '#' only the whole "
            f"last level")
    return topic_filter


def filter_regex(topic_filter: str) -> str:
    """An anchored RE2/Java pattern that matches exactly the topics ``topic_filter`` matches.

    It ends with ``\\z`` (end of text in RE2 and Java), not ``$``, which in Java (Spark's
    ``rlike``) and Python also matches before a final newline: ``a/b`` would match "a/b\\n".
    Python spells ``\\z`` as ``\\Z``: see ``python_regex``.
    """
    levels = check_filter(topic_filter).split("/")
    parts: list[str] = []
    for i, level in enumerate(levels):
        if level == "#":
            if i == 0:
                return r"(?s)^[^$].*\z"
            # "a/#" matches "a" itself too (MQTT 4.7.1.2): the separator and the rest are optional.
            return "(?s)^" + "/".join(parts) + r"(?:/.*)?\z"
        if level == "+":
            # A first-level wildcard must not match "$SYS"-style topics; it does match an empty level.
            parts.append(r"(?:[^$/][^/]*)?" if i == 0 else r"[^/]*")
        else:
            parts.append(re.escape(level))
    return "(?s)^" + "/".join(parts) + r"\z"


def python_regex(pattern: str) -> str:
    """``filter_regex``'s pattern for Python's ``re`` (which has no ``\\z`` before 3.14)."""
    return pattern.replace(r"\z", r"\Z")


def wildcard_levels(topic_filter: str) -> list[int]:
    """Indexes of the ``+`` levels of a filter: where a device id sits in ``devices/+/telemetry``."""
    return [i for i, level in enumerate(check_filter(topic_filter).split("/")) if level == "+"]
