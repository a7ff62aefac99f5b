"""``$SYS`` topics, built next to the router that publishes them.

Per-router values (``$SYS/brokerd/<node>/<router>/...``, plain numbers) go out as retained QoS 0
publishes through the router, so every router of the cluster has them; node-wide values
(``$SYS/broker/...``, Mosquitto's names and formats) are set in this router's retained store and
delivered to its own subscribers only, so each node of a cluster keeps its own ``$SYS/broker``.
Only changed values are published. The values come from the stats snapshots (``cluster/stats.py``
makes them); the router keeps ``$SYS/`` topics out of its commit log (they are not data).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .message import Message

if TYPE_CHECKING:
    from .router import Router

SYS_CLIENT_ID = "$SYS"


class SysTopics:
    """Publishes one router's ``$SYS`` values, changed values only."""

    __slots__ = ("router", "prefix", "_last")

    def __init__(self, router: Router, node_id: str, name: str) -> None:
        self.router = router
        self.prefix = f"$SYS/brokerd/{node_id}/{name}/"
        self._last: dict[str, bytes] = {}

    def publish(self, snap: dict[str, Any], node: dict[str, Any] | None) -> None:
        """Per-router topics cluster-wide from this router's snapshot; node topics to local
        subscribers from the node's aggregate, if there is one yet."""
        router = self.router
        last = self._last
        for suffix, value in router_sys_values(snap):
            topic = self.prefix + suffix
            payload = value.encode()
            if last.get(topic) != payload:
                last[topic] = payload
                router.publish(Message(topic, payload, 0, True, SYS_CLIENT_ID, router.router_id))
        if node is not None:
            for suffix, value in broker_sys_values(node):
                msg = Message("$SYS/broker/" + suffix, value.encode(), 0, True, SYS_CLIENT_ID, router.router_id)
                router.peer_retained(msg)
                router.deliver_remote(msg)


_LOADS = (("1min", "1min"), ("5min", "5min"), ("15min", "15min"))


def _per_minute(rates: dict[str, dict[str, float]], key: str) -> Iterator[tuple[str, float]]:
    for window, suffix in _LOADS:
        yield suffix, rates.get(window, {}).get(key, 0.0) * 60.0


def _load_topics(rates: dict[str, dict[str, float]], names: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """Mosquitto's load/*: the count per minute, averaged over 1, 5 and 15 minutes ("%.2f")."""
    for topic, key in names:
        for suffix, value in _per_minute(rates, key):
            yield f"load/{topic}/{suffix}", f"{value:.2f}"


def router_sys_values(snap: dict[str, Any]) -> list[tuple[str, str]]:
    """``$SYS/brokerd/<node>/<router>/<suffix>`` values of one router snapshot (plain numbers)."""
    t = snap["traffic"]
    c, m, lg = t["clients"], t["mesh"], t["log"]
    out = [
        ("version", f"brokerd {snap['version']}"),
        ("uptime", str(int(snap["uptime"]))),
        ("pid", str(snap["pid"])),
        ("clients/connected", str(snap["clients"]["connected"])),
        ("clients/sessions", str(snap["clients"]["sessions"])),
        ("subscriptions/count", str(snap["subscriptions"])),
        ("retained messages/count", str(snap["retained"])),
        ("messages/received", str(c["msgs_in"])),
        ("messages/sent", str(c["msgs_out"])),
        ("bytes/received", str(c["bytes_in"])),
        ("bytes/sent", str(c["bytes_out"])),
        ("messages/inflight", str(snap["inflight"])),
        ("messages/queued", str(snap["queued"])),
        ("mesh/messages/received", str(m["msgs_in"])),
        ("mesh/messages/sent", str(m["msgs_out"])),
        ("mesh/bytes/received", str(m["bytes_in"])),
        ("mesh/bytes/sent", str(m["bytes_out"])),
        ("log/records", str(lg["records"])),
        ("log/bytes", str(lg["bytes"])),
        ("cpu/percent", f"{snap['process']['cpu_percent']:.1f}"),
        ("memory/rss", str(snap["process"]["rss_bytes"])),
        ("loop/lag", f"{snap['loop_lag']:.4f}"),
    ]
    out += [(f"drops/{reason}", str(n)) for reason, n in snap["drops"].items()]
    out += _load_topics(snap["rates"], (("messages/received", "msgs_in"), ("messages/sent", "msgs_out"),
                                        ("bytes/received", "bytes_in"), ("bytes/sent", "bytes_out")))
    return out


def broker_sys_values(node: dict[str, Any]) -> list[tuple[str, str]]:
    """``$SYS/broker/<suffix>`` values of a node aggregate, with Mosquitto's names and formats.

    messages/* and publish/messages/* both count PUBLISH packets (Mosquitto's messages/* counts
    every packet type).
    """
    c = node["traffic"]["clients"]
    clients = node["clients"]
    connected, sessions = clients["connected"], clients["sessions"]
    out = [
        ("version", f"brokerd {node['version']}"),
        ("uptime", f"{int(node['uptime'])} seconds"),
        ("clients/connected", str(connected)),
        ("clients/active", str(connected)),
        ("clients/disconnected", str(max(0, sessions - connected))),
        ("clients/total", str(sessions)),
        ("messages/received", str(c["msgs_in"])),
        ("messages/sent", str(c["msgs_out"])),
        ("publish/messages/received", str(c["msgs_in"])),
        ("publish/messages/sent", str(c["msgs_out"])),
        ("publish/messages/dropped", str(sum(node["drops"].values()))),
        ("bytes/received", str(c["bytes_in"])),
        ("bytes/sent", str(c["bytes_out"])),
        ("subscriptions/count", str(node["subscriptions"])),
        ("retained messages/count", str(node["retained"])),
        ("messages/inflight", str(node["inflight"])),
        ("messages/queued", str(node["queued"])),
    ]
    out += _load_topics(node["rates"], (
        ("messages/received", "msgs_in"), ("messages/sent", "msgs_out"),
        ("publish/received", "msgs_in"), ("publish/sent", "msgs_out"),
        ("bytes/received", "bytes_in"), ("bytes/sent", "bytes_out"), ("connections", "connects")))
    return out
