"""The node's listeners: ``--listen`` URLs, TOML ``[[listener]]`` tables, and the secure default.

``--listen`` is repeatable and takes a scheme: ``mqtt://HOST:PORT`` (plain; ``HOST:PORT`` alone means
this), ``mqtts://HOST:PORT`` (TLS), ``ws://HOST:PORT/mqtt`` and ``wss://HOST:PORT/mqtt`` (MQTT over
WebSockets, subprotocol ``mqtt``; the path is the URL's). Every worker serves every listener.

The TLS options (``--certfile``, ``--keyfile``, ``--cafile``, ``--require-certificate``,
``--use-identity-as-username``, ``--tls-version``, named as Mosquitto's keys) apply to every TLS
listener; a ``[[listener]]`` table in the TOML file declares one listener (``listen = URL``) and may
override any of them for it, plus ``max_connections`` and ``allow_anonymous``.

Anonymous clients (no username): allowed on a loopback listener, refused on any other unless the
operator allows them (``allow_anonymous``, globally or per listener). With no listener configured the
node listens on ``mqtt://127.0.0.1:1883`` only, as Mosquitto 2 does; ``--port P`` is short for
``127.0.0.1:P`` (the network needs an explicit ``--listen``). The router enforces the rule
(``conn.listener.allow_anonymous``); start-up says which applies to each listener (``describe``), and
names a listener where every client is refused (anonymous clients refused, nothing to check a password).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from brokerd.connection.listener import SCHEMES, Listener

DEFAULT = Listener("mqtt", "127.0.0.1", 1883)
# What a [[listener]] table may set besides ``listen`` (the TLS ones are also global options).
TLS_KEYS = ("certfile", "keyfile", "cafile", "require_certificate", "use_identity_as_username", "tls_version")
TABLE_KEYS = ("listen", *TLS_KEYS, "max_connections", "allow_anonymous")

_URL = re.compile(r"(?:(?P<scheme>[A-Za-z]+)://)?(?P<host>\[[^\]]*\]|[^:/\[\]]*):(?P<port>\d+)(?P<path>/\S*)?")


def parse(value: str) -> Listener:
    """One ``--listen`` value: ``[SCHEME://]HOST:PORT[/PATH]`` (the path for ws:// and wss:// only)."""
    m = _URL.fullmatch(str(value).strip())
    if m is None:
        raise ValueError("expected HOST:PORT, or mqtt://, mqtts://, ws:// or wss:// and HOST:PORT")
    scheme = (m["scheme"] or "mqtt").lower()
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme}://: expected mqtt://, mqtts://, ws:// or wss://")
    port = int(m["port"])
    if not 1 <= port <= 65535:
        raise ValueError("the port must be a port number (1-65535)")
    listener = Listener(scheme, m["host"].strip("[]") or "0.0.0.0", port)
    if m["path"]:
        if not listener.websocket:
            raise ValueError("a path is for ws:// and wss:// listeners only")
        listener = replace(listener, path=m["path"])
    return listener


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may well resolve to a public address


def from_table(table: Any, source: str, convert: Callable[[str, Any, str], Any]) -> Listener:
    """A TOML ``[[listener]]`` table; ``convert(name, raw, where)`` checks a value as option ``name``."""
    if not isinstance(table, Mapping):
        raise ValueError(f"{source}: expected a table ([[listener]])")
    values: dict[str, Any] = {}
    for key, raw in table.items():
        name = key.replace("-", "_")
        if name not in TABLE_KEYS:
            raise ValueError(f"{source}: unknown key {key!r} (expected {', '.join(TABLE_KEYS)})")
        values[name] = convert(name, raw, f"{source}: {key}")
    if "listen" not in values:
        raise ValueError(f"{source}: needs listen = \"URL\" (mqtt://, mqtts://, ws:// or wss://HOST:PORT)")
    listener: Listener = values.pop("listen")
    return replace(listener, **values)


def resolve(listens: tuple[Listener, ...], settings: Any) -> tuple[Listener, ...]:
    """Complete each listener from the global options of ``settings`` (a Config) and check it."""
    everyone = getattr(settings, "allow_anonymous", None)  # the auth options' global switch, when given
    done = []
    for listener in listens:
        where = f"--listen {listener.url}"

        def pick(name: str, listener: Listener = listener) -> Any:
            value = getattr(listener, name)
            return getattr(settings, name, None) if value is None else value

        anonymous = listener.allow_anonymous
        if anonymous is None:
            anonymous = everyone if everyone is not None else is_loopback(listener.host)
        listener = replace(listener, allow_anonymous=bool(anonymous))
        if not listener.tls:
            done.append(replace(listener, certfile=None, keyfile=None, cafile=None, require_certificate=False,
                                use_identity_as_username=False, tls_version=None))
            continue
        tls = {name: pick(name) for name in TLS_KEYS}
        tls["require_certificate"] = bool(tls["require_certificate"])
        tls["use_identity_as_username"] = bool(tls["use_identity_as_username"])
        tls["tls_version"] = tls["tls_version"] or "tlsv1.2"
        if not tls["certfile"] or not tls["keyfile"]:
            raise ValueError(f"{where}: TLS needs --certfile and --keyfile (or certfile and keyfile in its "
                             "[[listener]] table)")
        if tls["require_certificate"] and not tls["cafile"]:
            raise ValueError(f"{where}: --require-certificate needs --cafile (the CA that signs client "
                             "certificates)")
        if tls["use_identity_as_username"] and not tls["require_certificate"]:
            raise ValueError(f"{where}: --use-identity-as-username needs --require-certificate")
        done.append(replace(listener, **tls))
    # A plain listener names the node's TLS listener to a client that starts a TLS handshake there.
    tls_url = next((x.url for x in done if x.scheme == "mqtts"), None)
    wss_url = next((x.url for x in done if x.scheme == "wss"), None)
    return tuple(replace(x, tls_url=tls_url if x.scheme == "mqtt" else wss_url if x.scheme == "ws" else None)
                 for x in done)


def describe(listeners: tuple[Listener, ...], implicit: bool, checked: bool = False,
             anonymous: bool = True) -> list[str]:
    """What start-up says of each listener: where, TLS, and whether anonymous clients get in.
    ``checked``: a password file or plugin verifies user names; ``anonymous``: the node's own rule
    (``auth_setup.anonymous_allowed``). Where neither a check nor anonymous clients are possible,
    every client is refused, and the line says so (a quick start that refuses everyone must say why)."""
    lines = []
    for x in listeners:
        if not (checked or x.use_identity_as_username or (x.allow_anonymous and anonymous)):
            lines.append(f"listener {x.url}: every client refused: anonymous clients are not allowed here and "
                         "no password file or auth plugin checks user names (--password-file FILE, or "
                         "--allow-anonymous on)")
            continue
        parts = []
        if x.tls:
            parts.append(f"TLS ({x.tls_version} or later" + (", client certificate required" if
                         x.require_certificate else "") + (", its CN is the username" if
                         x.use_identity_as_username else "") + ")")
        if x.max_connections:
            parts.append(f"at most {x.max_connections} clients")
        if x.allow_anonymous and anonymous:
            why = ("no listener configured: loopback only, anonymous clients allowed; "
                   "--listen mqtt://0.0.0.0:1883 opens it to the network" if implicit
                   else "anonymous clients allowed" + (" (loopback)" if is_loopback(x.host) else ""))
            if not checked and not x.use_identity_as_username:
                why += "; user names are not checked (no password file): every client is anonymous"
        elif x.allow_anonymous:  # the listener would let them in, the node's rule does not
            why = "anonymous clients refused (the node authenticates its clients)"
        else:
            why = ("anonymous clients refused (not loopback; --allow-anonymous on, or allow_anonymous = true "
                   "in its [[listener]] table, lets them in)")
        parts.append(why)
        lines.append(f"listener {x.url}: " + ", ".join(parts))
    return lines


def tls_problem(listeners: tuple[Listener, ...]) -> str | None:
    """Why a TLS listener's certificate, key or CA cannot be loaded (checked before forking), or None."""
    from brokerd.connection.tls import server_context

    for x in listeners:
        if x.tls:
            try:
                server_context(x)
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                return f"--listen {x.url}: {exc}"
    return None


async def serve_listeners(loop: Any, settings: Any, connection: Callable[[Listener], Any],
                          contexts: dict[Listener, Any] | None = None) -> list[Any]:
    """Bind every listener of ``settings`` (SO_REUSEPORT: each worker binds them all, the kernel spreads
    the clients). ``connection(listener)`` makes the MQTT protocol of one client; which layers go around
    it (TLS, WebSocket) is decided here, once per listener, never per packet. ``contexts`` gets each
    TLS listener's SSL context (what ``reload_tls`` reloads). TLS is not the loop's ``ssl=``: a
    ``Handshaking`` protocol counts and rate-limits the socket from accept and bounds its handshake."""
    from functools import partial

    servers = []
    for x in settings.listeners or resolve((replace(DEFAULT, host=settings.listen[0], port=settings.listen[1]),),
                                           settings):
        context = None
        if x.tls:
            from brokerd.connection.tls import server_context

            context = server_context(x)
            if contexts is not None:
                contexts[x] = context
        factory: Callable[[], Any]
        if x.websocket:
            from brokerd.connection.websocket import WebSocketConnection

            def websocket(x: Listener = x) -> Any:
                return WebSocketConnection(connection(x), x.path)
            factory = websocket
        else:
            factory = partial(connection, x)
        if context is not None:
            from brokerd.connection.handshake import Handshaking

            def handshaking(inner: Callable[[], Any] = factory, x: Listener = x, context: Any = context) -> Any:
                made = inner()
                return Handshaking(made, context, made.guard, x)
            factory = handshaking
        servers.append(await loop.create_server(factory, x.host, x.port, reuse_port=True, backlog=4096))
    return servers


def reload_tls(contexts: dict[Listener, Any]) -> None:
    """SIGUSR1 in a worker (the supervisor's SIGHUP): the TLS listeners' certificate, key and CA files
    again, for new connections; on an error the listener keeps what it had (logged)."""
    import logging

    from brokerd.connection.tls import reload_context

    log = logging.getLogger(__name__)
    for listener, context in contexts.items():
        try:
            reload_context(context, listener)
        except (ValueError, OSError) as exc:
            log.error("%s: TLS files not reloaded, the previous certificate stays in use: %s", listener.url, exc)
        else:
            log.info("%s: TLS certificate reloaded from %s", listener.url, listener.certfile)
