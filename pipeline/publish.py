"""Publishing job results back into the broker, from the Spark driver, with paho-mqtt.

Why from the driver: results are small (one message per window and dimension or device), the
driver already has them after a ``collect``, and one MQTT connection per run is kinder to the broker
than one per executor task. Messages are retained by default, so a dashboard that subscribes later
still gets the newest window at once. Every wait is bounded: an unreachable broker fails the run
with a one-line error instead of hanging it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import uuid
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0


class PublishError(RuntimeError):
    """The broker could not be reached or did not acknowledge a publish in time."""


def parse_host_port(text: str, default_port: int = 1883) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        return text, default_port
    try:
        return host.strip("[]") or "127.0.0.1", int(port)
    except ValueError:
        raise PublishError(f"--publish-to: expected HOST:PORT, not {text!r}") from None


def topic_level(text: str) -> str:
    """A value made safe as one topic level: no separators or wildcards (a client id may hold them)."""
    cleaned = "".join("_" if c in "/+#\x00" else c for c in str(text))
    return cleaned or "_"


def json_default(value: Any) -> Any:
    """Timestamps as ISO 8601 UTC; what Spark collects for TimestampType is a naive UTC datetime
    (the pipeline's sessions run in UTC)."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def encode(payload: Any) -> bytes:
    return json.dumps(payload, default=json_default, separators=(",", ":"), sort_keys=True).encode()


class Publisher:
    """One MQTT connection that publishes and waits for each acknowledgement (QoS 1/2)."""

    def __init__(self, address: str, *, qos: int = 1, retain: bool = True, client_id: str | None = None,
                 timeout: float = TIMEOUT_S) -> None:
        try:
            import paho.mqtt.client as mqtt
            from paho.mqtt.enums import CallbackAPIVersion
        except ImportError:
            raise PublishError("--publish-to needs paho-mqtt: pip install 'paho-mqtt>=2.0'") from None
        self.host, self.port = parse_host_port(address)
        self.qos = qos
        self.retain = retain
        self.timeout = timeout
        self.sent = 0
        self._connected = threading.Event()
        self._rc: int | None = None
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2,
                                   client_id=client_id or f"brokerd-pipeline-{uuid.uuid4().hex[:8]}")
        self._client.on_connect = self._on_connect
        self._mqtt = mqtt

    def _on_connect(self, _c: object, _u: object, _flags: object, rc: Any, _props: object) -> None:
        self._rc = getattr(rc, "value", rc)
        self._connected.set()

    def __enter__(self) -> Publisher:
        try:
            self._client.connect(self.host, self.port, keepalive=60)
        except OSError as exc:
            raise PublishError(f"--publish-to {self.host}:{self.port}: cannot connect: {exc}") from None
        self._client.loop_start()
        if not self._connected.wait(self.timeout):
            self.close()
            raise PublishError(f"--publish-to {self.host}:{self.port}: no CONNACK within {self.timeout} s")
        if self._rc != 0:
            self.close()
            raise PublishError(f"--publish-to {self.host}:{self.port}: connection refused (reason {self._rc})")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def publish(self, topic: str, payload: Any) -> None:
        info = self._client.publish(topic, encode(payload), qos=self.qos, retain=self.retain)
        if info.rc != self._mqtt.MQTT_ERR_SUCCESS:
            raise PublishError(f"publish to {topic} failed: {self._mqtt.error_string(info.rc)}")
        info.wait_for_publish(self.timeout)
        if not info.is_published():
            raise PublishError(f"publish to {topic}: not acknowledged within {self.timeout} s")
        self.sent += 1

    def publish_all(self, messages: Iterable[tuple[str, Any]]) -> int:
        n = 0
        for topic, payload in messages:
            self.publish(topic, payload)
            n += 1
        return n

    def close(self) -> None:
        try:
            self._client.disconnect()
        finally:
            self._client.loop_stop()
