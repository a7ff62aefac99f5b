"""One listener's settings, as a connection sees them: which scheme it serves, its TLS settings and
its policy for anonymous clients.

Parsed and completed by ``brokerd.cluster.listeners`` (from ``--listen`` URLs, the global TLS options
and TOML ``[[listener]]`` tables); after that every field is set (``None`` only where the setting does
not apply, such as the certificate files of a plain listener). Each connection holds its listener as
``conn.listener``; the router reads ``allow_anonymous`` and ``use_identity_as_username`` from it.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMES = ("mqtt", "mqtts", "ws", "wss")
TLS_VERSIONS = ("tlsv1.2", "tlsv1.3")


@dataclass(frozen=True, slots=True)
class Listener:
    scheme: str = "mqtt"  # mqtt | mqtts | ws | wss
    host: str = "127.0.0.1"
    port: int = 1883
    path: str = "/mqtt"  # the WebSocket listeners' HTTP path
    certfile: str | None = None
    keyfile: str | None = None
    cafile: str | None = None
    require_certificate: bool | None = None  # refuse a TLS client without a certificate the CA signed
    use_identity_as_username: bool | None = None  # the client certificate's CN (or first SAN) is the username
    tls_version: str | None = None  # the lowest TLS version accepted: tlsv1.2 or tlsv1.3
    max_connections: int | None = None  # clients of this listener per node (None: only the node's limit)
    allow_anonymous: bool | None = None  # clients without a username may connect
    tls_url: str | None = None  # plain listeners: the node's TLS listener, named to a client that speaks TLS

    @property
    def tls(self) -> bool:
        return self.scheme in ("mqtts", "wss")

    @property
    def websocket(self) -> bool:
        return self.scheme in ("ws", "wss")

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}" + (self.path if self.websocket else "")

    def __str__(self) -> str:
        return self.url
