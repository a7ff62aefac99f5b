"""brokerd's options: one table of them, read from the command line, the environment and a TOML file.

Every option is declared once in ``OPTIONS`` (name, type, default, help); argparse, the TOML reader,
the ``BROKERD_*`` environment variables, ``--help`` and docs/configuration.md's table (``cluster.options_doc``) all
come from it, so they cannot disagree. Precedence: command line > environment > TOML > default. A
wrong option or value raises ``ConfigError`` whose message is one line naming the option (or the
variable); the CLI prints it and exits 2.
"""

from __future__ import annotations

import argparse
import os
import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from brokerd.connection.listener import TLS_VERSIONS
from brokerd.router.limits import ClientLimits

from . import __version__
from . import listeners as _listeners
from .cpus import usable_cpus
from .option_values import (
    AGREEMENT_OFF,
    EXPECTED,
    address,
    agreement_address,
    at_least,
    host_port,
    host_port_or_off,
    on_off,
    port_number,
    positive,
    size,
    word,
)

# The limits a client cannot get around have their defaults in one home, the router's.
_LIMITS = ClientLimits()


class ConfigError(Exception):
    """A bad option: the message names it."""


@dataclass(frozen=True)
class Option:
    name: str  # attribute and TOML key (underscores); the flag is --name-with-dashes
    type: Callable[[Any], Any]
    default: Any
    help: str
    metavar: str | None = None
    repeat: bool = False
    choices: tuple[str, ...] | None = None
    check: Callable[[Any], str | None] | None = None  # returns an error text or None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


OPTIONS: tuple[Option, ...] = (
    Option("workers", int, usable_cpus(), "worker processes (one router each)", "N", check=at_least(1)),
    Option("listen", _listeners.parse, (_listeners.DEFAULT,), "MQTT listener, repeatable: mqtt://HOST:PORT "
           "(plain; HOST:PORT alone too), mqtts://HOST:PORT (TLS), ws://HOST:PORT/mqtt or wss://HOST:PORT/mqtt "
           "(WebSockets); TOML: also [[listener]] tables (see Listeners)", "URL", repeat=True),
    Option("certfile", str, None, "TLS listeners' certificate chain (PEM)", "FILE"),
    Option("keyfile", str, None, "TLS listeners' private key (PEM)", "FILE"),
    Option("cafile", str, None, "CA certificates (PEM) that client certificates of TLS listeners are checked "
           "against", "FILE"),
    Option("require_certificate", on_off, False, "TLS listeners refuse clients without a certificate signed "
           "by --cafile", "on|off"),
    Option("use_identity_as_username", on_off, False, "the client certificate's CN (or first SAN) is the "
           "username (needs --require-certificate)", "on|off"),
    Option("tls_version", word, "tlsv1.2", "lowest TLS version TLS listeners accept", choices=TLS_VERSIONS),
    Option("node_id", str, socket.gethostname().split(".")[0], "this node's name in the cluster", "ID"),
    Option("mesh", host_port, None, "where this node accepts mesh traffic from other nodes (enables multi-host)",
           "HOST:PORT", check=address),
    Option("mesh_advertise", host_port, None, "the address other nodes reach this node's mesh at, when it is "
           "not --mesh's (NAT, containers, a proxy in front); router i at PORT+i", "HOST:PORT", check=address),
    Option("peer", host_port, (), "another node's --mesh address (repeatable; one live peer is enough)",
           "HOST:PORT", repeat=True, check=address),
    Option("mesh_key", str, None, "CURVE secret key file of the cluster (from `brokerd keygen`; the same on "
           "every node): authenticated, encrypted mesh traffic; needed with --mesh", "FILE"),
    Option("mesh_insecure", on_off, False, "allow --mesh without --mesh-key (unauthenticated, unencrypted "
           "mesh: any process that reaches it, local ones too, can read and inject messages)", "on|off"),
    Option("mesh_hwm", int, 10_000, "mesh high-water mark in frames per peer (backpressure beyond it)", "N",
           check=at_least(1)),
    Option("mesh_timeout", float, 3.0, "seconds of silence after which a peer router counts as gone", "SECONDS",
           check=lambda v: None if v > 0 else "must be positive"),
    Option("mesh_backlog", size, 64 << 20, "bytes of frames kept for a silent peer router, delivered when it "
           "is heard again (beyond: dropped and counted as mesh_peer_gone)", "BYTES", check=at_least(0)),
    Option("mesh_forget", float, 300.0, "seconds a silent peer router's interest and backlog are kept before "
           "it is forgotten", "SECONDS", check=lambda v: None if v > 0 else "must be positive"),
    Option("agreement", host_port_or_off, None, "where this node's Raft member listens (TCP; the address the "
           "other nodes reach, its name in the cluster): who serves each persistent session and which followers "
           "are in sync, agreed by a majority; needs --mesh-key; --mesh needs it, or `off` (heartbeat leases, "
           "which can lose acknowledged messages in a network partition)", "HOST:PORT|off", check=agreement_address),
    Option("agreement_peer", host_port, (), "another node's --agreement address (repeatable: every other "
           "member; the members are this node and these; this node's own, given too, is left out, so that "
           "every node can be given one list)", "HOST:PORT", repeat=True, check=address),
    Option("agreement_timeout", float, 5.0, "seconds a proposal may wait for a majority before what needed it "
           "is refused", "SECONDS", check=positive),
    Option("replication_factor", int, None, "nodes that hold each router's commit log (its own and R-1 "
           "followers on other nodes); default 1 alone, 2 with --mesh", "R", check=at_least(1)),
    Option("min_insync", int, None, "nodes (counting the router's own) that must hold a QoS 1/2 message "
           "before it is acknowledged (Kafka's min.insync.replicas); default min(2, R); capped at the live "
           "nodes", "M", check=at_least(1)),
    Option("replica_lag", float, 5.0, "seconds a follower may leave a batch unacknowledged before it counts "
           "as out of sync (it no longer holds acknowledgements back)", "SECONDS", check=positive),
    Option("replica_timeout", float, 10.0, "seconds a QoS 1/2 acknowledgement waits for --min-insync nodes "
           "before it is refused (the connection closes; the client resends)", "SECONDS", check=positive),
    Option("data_dir", str, "./data", "commit log directory (one log per router under DATA/<node>/<router>)",
           "DIR"),
    Option("log", on_off, True, "commit log on/off", "on|off"),
    Option("fsync", word, "interval", "fsync policy of the commit log", choices=("always", "interval", "never")),
    Option("fsync_interval_ms", int, 1000, "fsync period with --fsync interval (sooner once 4 MiB wait for it)", "MS", check=at_least(1)),
    Option("segment_bytes", size, 64 << 20, "commit log segment size", "BYTES", check=at_least(4096)),
    Option("retention_bytes", size, 10 << 30, "delete old segments beyond this total size per router, so "
           "that a flood to topics nobody reads cannot fill the disk (0: no limit)", "BYTES", check=at_least(0)),
    Option("retention_hours", float, 168.0, "delete segments older than this (0: keep forever)", "HOURS",
           check=at_least(0)),
    Option("max_packet_size", size, 1 << 20, "largest MQTT packet accepted (bigger: connection closed)",
           "BYTES", check=at_least(64)),
    Option("max_topic_levels", int, 128, "most levels in a topic name or filter (deeper: a PUBLISH or will "
           "closes the connection, a SUBSCRIBE filter is refused in the SUBACK)", "N", check=at_least(1)),
    Option("max_inflight", int, 20, "unacknowledged QoS 1/2 messages per client on the wire", "N",
           check=at_least(1)),
    Option("max_queued", int, 1000, "QoS 1/2 messages queued per offline or slow session (newer are dropped)",
           "N", check=at_least(0)),
    Option("max_connections", int, 100_000, "client connections per node (beyond: CONNACK server unavailable)",
           "N", check=at_least(1)),
    Option("max_client_buffer", size, 1 << 20, "outgoing bytes buffered per client before QoS 0 messages "
           "to it are dropped (slow consumer)", "BYTES", check=at_least(4096)),
    Option("max_client_id_length", int, _LIMITS.max_client_id_length, "longest client id accepted (longer: CONNACK 0x02 identifier "
           "rejected, MQTT 5: 0x85)", "N", check=at_least(23)),
    Option("max_subscriptions", int, _LIMITS.max_subscriptions, "subscriptions per client, their filters 256 characters each "
           "on average (beyond: the new filter gets SUBACK 0x80, MQTT 5: 0x97 quota exceeded)", "N", check=at_least(1)),
    Option("max_retained", int, _LIMITS.max_retained, "retained messages per router (beyond: a new retained topic is "
           "delivered but not retained)", "N", check=at_least(1)),
    Option("max_retained_bytes", size, _LIMITS.max_retained_bytes, "memory retained messages may take per router, as "
           "held: ~1 KiB + 4 x topic + 3 x payload each (beyond: delivered but not retained)", "BYTES", check=at_least(1024)),
    Option("max_qos2_pending", int, _LIMITS.max_qos2_pending, "received QoS 2 messages per client awaiting PUBREL (beyond: the "
           "connection is closed, MQTT 5: DISCONNECT 0x93; also MQTT 5's Receive Maximum in CONNACK)", "N",
           check=lambda v: None if 1 <= v <= 65535 else "must be 1-65535"),
    Option("qos2_timeout", float, _LIMITS.qos2_timeout, "seconds a received QoS 2 message waits for its PUBREL before its "
           "packet id is forgotten", "SECONDS", check=positive),
    Option("packet_timeout", float, 30.0, "seconds a connection may hold an unfinished packet (longer: "
           "closed)", "SECONDS", check=positive),
    Option("max_keepalive", int, _LIMITS.max_keepalive, "largest keepalive in seconds (MQTT 5: keepalive 0 or more gets this "
           "as Server Keep Alive; MQTT 3.1.1: more is refused with CONNACK 0x02, 0 is held to it)", "SECONDS",
           check=lambda v: None if 1 <= v <= 65535 else "must be 1-65535"),
    Option("max_session_expiry", float, _LIMITS.max_session_expiry, "seconds an offline persistent session is kept at most, "
           "MQTT 3.1.1 sessions included (MQTT 5: a longer Session Expiry Interval is cut to this)", "SECONDS",
           check=positive),
    Option("max_topic_alias", int, _LIMITS.max_topic_alias, "topic aliases an MQTT 5 client may set per "
           "connection, sent as Topic Alias Maximum in CONNACK (an alias beyond it: DISCONNECT 0x94; 0: none "
           "allowed, as Mosquitto's max_topic_alias)", "N", check=lambda v: None if 0 <= v <= 65535 else "must be 0-65535"),
    Option("topic_alias_out", on_off, False, "send repeated topics to MQTT 5 clients that allow it (Topic Alias "
           "Maximum in their CONNECT) as topic aliases, saving bandwidth on constrained links", "on|off"),
    Option("max_topic_alias_out", int, _LIMITS.max_topic_alias_out, "topic aliases the broker gives one "
           "connection's topics with --topic-alias-out on, each holding its topic for the connection's life: "
           "the client's Topic Alias Maximum is cut to this (as Mosquitto's max_topic_alias_broker)", "N",
           check=lambda v: None if 0 <= v <= 65535 else "must be 0-65535"),
    Option("max_connection_rate", float, 0.0, "new connections per second per listener, shared by the "
           "workers (beyond: the socket is closed at once; 0: no limit, as Mosquitto)", "N", check=at_least(0)),
    Option("max_client_msg_rate", float, 0.0, "packets per second one client may send (beyond: its reads are "
           "paused, never disconnected; 0: no limit)", "N", check=at_least(0)),
    Option("max_client_byte_rate", size, 0, "bytes per second one client may send (beyond: its reads are "
           "paused; 0: no limit)", "BYTES", check=at_least(0)),
    Option("read_budget", int, 16, "packets of one client handled per loop iteration before the rest of its "
           "read waits a turn (fairness for quiet clients; higher: more batching, longer tail latency)", "N",
           check=at_least(1)),
    Option("turn_budget", int, 32, "packets all clients together get handled per loop iteration before each "
           "busy client is cut to 4 per turn (0: no limit): bounds how long a quiet client waits behind "
           "many busy ones", "N", check=at_least(0)),
    Option("fan_budget", int, 512, "deliveries one client's publishes may cause per loop iteration before the "
           "rest of its read waits a turn, one more per KiB of message (0: no limit): bounds how long others "
           "wait behind a fan-out", "N", check=at_least(0)),
    Option("stats_interval", float, 1.0, "seconds between stats snapshots", "SECONDS", check=positive),
    Option("stats_port", int, None, "publish stats on tcp://HOST:PORT+i (router i) instead of ipc", "PORT",
           check=port_number),
    Option("metrics_port", int, None, "serve Prometheus /metrics on this port", "PORT", check=port_number),
    Option("metrics_host", str, "127.0.0.1", "address /metrics listens on (give 0.0.0.0 or an interface's "
           "address for a Prometheus on another host)", "HOST"),
    Option("metrics_password_file", str, None, "require HTTP basic auth on /metrics: users and passwords in "
           "Mosquitto's format (`brokerd passwd FILE USER`)", "FILE"),
    Option("metrics_certfile", str, None, "serve /metrics over HTTPS with this certificate (PEM)", "FILE"),
    Option("metrics_keyfile", str, None, "the private key of --metrics-certfile (PEM)", "FILE"),
    Option("stats_host", str, "127.0.0.1", "address of the tcp stats sockets with --stats-port (give "
           "an interface's address for `brokerd stats` on other hosts; not authenticated)", "HOST"),
    Option("stats_clients", on_off, True, "include per-client rows (client ids, addresses) in stats "
           "snapshots and `brokerd stats --connections`; off keeps them out of every stats socket", "on|off"),
    Option("sys_interval", float, 10.0, "seconds between $SYS topic updates (0: off)", "SECONDS",
           check=at_least(0)),
    Option("log_level", word, "info", "logging level", choices=("debug", "info", "warning", "error")),
    Option("log_file", str, None, "also write the log to FILE (appended; reopened when logrotate renames it, "
           "and on SIGHUP)", "FILE"),
    Option("password_file", str, None, "Mosquitto password file (`brokerd passwd` or mosquitto_passwd): "
           "clients log in with a user in it (reloaded on SIGHUP)", "FILE"),
    Option("acl_file", str, None, "Mosquitto ACL file (user, topic, pattern lines) checked on SUBSCRIBE, "
           "PUBLISH and delivery (reloaded on SIGHUP)", "FILE"),
    Option("allow_anonymous", on_off, None, "clients without a user name may connect (default: off once a "
           "password file or an auth plugin is configured, else on)", "on|off"),
    Option("session_owner", word, "refuse", "a CONNECT of another user with a session's client id: refused "
           "(CONNACK not authorized; the session stays its owner's) or given a clean session (the old one ends, "
           "logged)", choices=("refuse", "replace")),
    Option("auth_plugin", str, None, "Python auth plugin MODULE:ATTR with authenticate() and authorize(); "
           "brokerd.cluster.auth_http:HttpAuth asks an HTTP service", "MODULE:ATTR"),
    Option("auth_plugin_opt", str, (), "KEY=VALUE option handed to the auth plugin (repeatable), e.g. "
           "url=http://127.0.0.1:8080/mqtt/auth", "KEY=VALUE", repeat=True),
)
_BY_NAME = {o.name: o for o in OPTIONS}


@dataclass
class Config:
    workers: int = 1
    listen: tuple[str, int] = ("0.0.0.0", 1883)  # the first listener's address (run dir, health, stats)
    listeners: tuple[Any, ...] = ()  # every listener (brokerd.connection.listener.Listener), completed
    listeners_implicit: bool = False  # no listener configured: the loopback default
    certfile: str | None = None
    keyfile: str | None = None
    cafile: str | None = None
    require_certificate: bool = False
    use_identity_as_username: bool = False
    tls_version: str = "tlsv1.2"
    node_id: str = "local"
    mesh: tuple[str, int] | None = None
    mesh_advertise: tuple[str, int] | None = None
    peer: tuple[tuple[str, int], ...] = ()
    mesh_key: str | None = None
    mesh_insecure: bool = False
    mesh_hwm: int = 10_000
    mesh_timeout: float = 3.0
    mesh_backlog: int = 64 << 20
    mesh_forget: float = 300.0
    agreement: tuple[str, int] | None = None
    agreement_peer: tuple[tuple[str, int], ...] = ()
    agreement_timeout: float = 5.0
    agreement_off: bool = False  # --agreement off: a cluster on the lease rules, as its operator said
    replication_factor: int | None = None
    min_insync: int | None = None
    replica_lag: float = 5.0
    replica_timeout: float = 10.0
    data_dir: str = "./data"
    log: bool = True
    fsync: str = "interval"
    fsync_interval_ms: int = 1000
    segment_bytes: int = 64 << 20
    retention_bytes: int = 10 << 30
    retention_hours: float = 168.0
    max_packet_size: int = 1 << 20
    max_topic_levels: int = 128
    max_inflight: int = 20
    max_queued: int = 1000
    max_connections: int = 100_000
    max_client_buffer: int = 1 << 20
    max_client_id_length: int = _LIMITS.max_client_id_length
    max_subscriptions: int = _LIMITS.max_subscriptions
    max_retained: int = _LIMITS.max_retained
    max_retained_bytes: int = _LIMITS.max_retained_bytes
    max_qos2_pending: int = _LIMITS.max_qos2_pending
    qos2_timeout: float = _LIMITS.qos2_timeout
    packet_timeout: float = 30.0
    max_keepalive: int = _LIMITS.max_keepalive
    max_session_expiry: float = _LIMITS.max_session_expiry
    max_topic_alias: int = _LIMITS.max_topic_alias
    topic_alias_out: bool = False
    max_topic_alias_out: int = _LIMITS.max_topic_alias_out
    max_connection_rate: float = 0.0
    max_client_msg_rate: float = 0.0
    max_client_byte_rate: int = 0
    read_budget: int = 16
    turn_budget: int = 32
    fan_budget: int = 512
    stats_interval: float = 1.0
    stats_port: int | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_password_file: str | None = None
    metrics_certfile: str | None = None
    metrics_keyfile: str | None = None
    stats_host: str = "127.0.0.1"
    stats_clients: bool = True
    sys_interval: float = 10.0
    log_level: str = "info"
    log_file: str | None = None
    password_file: str | None = None
    acl_file: str | None = None
    allow_anonymous: bool | None = None
    session_owner: str = "refuse"
    auth_plugin: str | None = None
    auth_plugin_opt: tuple[str, ...] = ()
    config_file: str | None = field(default=None)


def _convert(opt: Option, raw: Any, source: str) -> Any:
    try:
        if opt.repeat:
            items = raw if isinstance(raw, (list, tuple)) else [raw]
            value: Any = tuple(opt.type(x) for x in items)
        elif opt.type is str or isinstance(raw, str):
            value = opt.type(raw)
        elif opt.type is float and isinstance(raw, (int, float)):
            value = float(raw)
        elif opt.type is host_port and isinstance(raw, str):
            value = host_port(raw)
        else:
            value = opt.type(raw)
    except (ValueError, TypeError) as exc:
        if opt.repeat and isinstance(raw, (list, tuple)) and len(raw) == 1:
            raw = raw[0]  # one value given: shown as given
        raise ConfigError(f"{source}: invalid value {raw!r} ({EXPECTED.get(opt.type) or exc})") from None
    if opt.choices and value not in opt.choices:
        raise ConfigError(f"{source}: invalid value {raw!r} (choose from {', '.join(opt.choices)})")
    if opt.check and value is not None:
        given = raw if isinstance(raw, (list, tuple)) else [raw]
        for item, shown in zip(value, given, strict=True) if opt.repeat else [(value, raw)]:
            problem = opt.check(item)
            if problem:
                raise ConfigError(f"{source}: {problem}, got {shown!r}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="brokerd",
        description="A multi-process, sharded MQTT broker cluster. Subcommands: "
        "`brokerd stats`, `brokerd log tail|check`, `brokerd keygen` (each has --help).",
    )
    p.add_argument("--version", action="version", version=f"brokerd {__version__}")
    p.add_argument("--config", metavar="FILE", help="read options from a TOML file (command line wins)")
    p.add_argument("--port", metavar="P", help="short for --listen 127.0.0.1:P (loopback; the network "
                   "needs --listen mqtt://0.0.0.0:P)")
    for opt in OPTIONS:
        default = _shown_default(opt)
        kwargs: dict[str, Any] = {"metavar": opt.metavar, "help": opt.help,
                                  "default": argparse.SUPPRESS}
        if opt.choices:
            kwargs["choices"] = opt.choices
            kwargs["type"] = opt.type  # word: any case
            kwargs.pop("metavar")
        if opt.repeat:
            kwargs["action"] = "append"
        p.add_argument(opt.flag, **kwargs)
        # Show the default in --help without letting argparse fill it in (TOML must be able to set it).
        p._actions[-1].help = f"{opt.help} (default: {default or 'none'})"
    return p


ENV_PREFIX = "BROKERD_"


def env_name(name: str) -> str:
    """The environment variable of option ``name``: ``BROKERD_MAX_QUEUED`` for ``max_queued``."""
    return ENV_PREFIX + name.upper()


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The options set by ``BROKERD_<NAME>`` variables (empty ones count as unset; other
    ``BROKERD_`` variables, such as ``BROKERD_RUN_DIR``, are not options and are left alone).
    A repeatable option takes a comma-separated list: ``BROKERD_PEER=b:7000,c:7000``."""
    values: dict[str, Any] = {}
    port = environ.get(env_name("port"), "").strip()
    if port:  # like --port and TOML's port: short for listen = "127.0.0.1:P"; BROKERD_LISTEN wins
        problem = None if port.isdigit() else "expected a port number"
        problem = problem or port_number(int(port))
        if problem:
            raise ConfigError(f"{env_name('port')}: {problem}, got {port!r}")
        values["listen"] = (_listeners.parse(f"127.0.0.1:{port}"),)
    for opt in OPTIONS:
        var = env_name(opt.name)
        raw: Any = environ.get(var, "").strip()
        if not raw:
            continue
        if opt.repeat:
            raw = [item.strip() for item in raw.split(",") if item.strip()]
        values[opt.name] = _convert(opt, raw, var)
    return values


def load(argv: list[str], environ: Mapping[str, str] | None = None) -> Config:
    """Command line → Config: defaults, overlaid by the TOML file (``--config`` or
    ``BROKERD_CONFIG``), by ``BROKERD_*`` variables of ``environ`` (``os.environ`` by default), and
    by flags."""
    args = vars(build_parser().parse_args(argv))
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {o.name: o.default for o in OPTIONS}
    config_file = args.pop("config", None)
    given_as = "--config"
    if not config_file and environ.get(env_name("config"), "").strip():
        config_file, given_as = environ[env_name("config")].strip(), env_name("config")
    if config_file:
        try:
            with open(config_file, "rb") as f:
                table = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"{given_as}: cannot read {config_file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{given_as}: {config_file} is not valid TOML: {exc}") from None
        for key, raw in table.items():
            name = key.replace("-", "_")
            if name == "port":
                values["listen"] = _convert(_BY_NAME["listen"], f"127.0.0.1:{raw}", f"{config_file}: port")
                continue
            if name == "listener":  # [[listener]] tables: listeners of their own, with their settings
                values["listen"] = _toml_listeners(table, raw, config_file)
                continue
            opt = _BY_NAME.get(name)
            if opt is None:
                raise ConfigError(f"{config_file}: unknown option {key!r}")
            values[name] = _convert(opt, raw, f"{config_file}: {key}")
    values.update(_from_env(environ))
    port = args.pop("port", None)
    if port is not None:
        if not str(port).isdigit():
            raise ConfigError(f"--port: invalid value {port!r} ({EXPECTED[int]})")
        port = int(port)
        problem = port_number(port)
        if problem:
            raise ConfigError(f"--port: {problem}, got {port!r}")
        values["listen"] = (_listeners.parse(f"127.0.0.1:{port}"),)
    for name, raw in args.items():
        opt = _BY_NAME[name]
        values[name] = _convert(opt, raw, opt.flag)
    cfg = Config(**values, config_file=config_file)
    try:
        cfg.listeners = _listeners.resolve(values["listen"], cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    cfg.listeners_implicit = values["listen"] is _BY_NAME["listen"].default
    cfg.listen = cfg.listeners[0].address
    if cfg.peer and cfg.mesh is None:
        raise ConfigError("--peer: needs --mesh HOST:PORT (where this node accepts mesh traffic)")
    if cfg.mesh_advertise is not None and cfg.mesh is None:
        raise ConfigError("--mesh-advertise: needs --mesh HOST:PORT (where this node accepts mesh traffic)")
    if not cfg.node_id or "/" in cfg.node_id or "+" in cfg.node_id or "#" in cfg.node_id:
        raise ConfigError(f"--node-id: invalid value {cfg.node_id!r} (no '/', '+' or '#')")
    if cfg.agreement == AGREEMENT_OFF:
        cfg.agreement, cfg.agreement_off = None, True
    _check_ports(cfg)
    _check_replication(cfg)
    _check_agreement(cfg)
    if cfg.mesh is not None and not cfg.mesh_key and not cfg.mesh_insecure:
        # Without a key any process that reaches the mesh port can read every message, inject
        # publishes and take sessions over: loopback too, since every local user reaches it.
        raise ConfigError(f"--mesh: {cfg.mesh[0]}:{cfg.mesh[1]} needs --mesh-key FILE, loopback too (without "
                          "it any process that reaches the port joins the cluster): make the key once with "
                          "`brokerd keygen --out cluster` and start every node with --mesh-key "
                          "cluster.key_secret, or run the mesh unauthenticated with --mesh-insecure on")
    if cfg.mesh is not None and cfg.agreement is None and not cfg.agreement_off:
        # Without agreement heartbeat leases decide who serves a session, and a partition can
        # lose acknowledged messages (issue 41): a cluster runs so only when its operator says so.
        raise ConfigError(f"--mesh: {_joined(cfg.mesh)} needs --agreement HOST:PORT (where this node's Raft "
                          "member listens) and --agreement-peer HOST:PORT for every other node's, the same "
                          "list on every node (README, Several hosts): who serves each persistent session is "
                          "then agreed by a majority; or --agreement off to run on heartbeat leases, which "
                          "can lose acknowledged QoS 1/2 messages in a network partition")
    return cfg


WILDCARDS = ("", "0.0.0.0", "::")  # bind addresses that name no one address to reach or leave from


def _check_replication(cfg: Config) -> None:
    """Fill in the replication defaults (1 alone, 2 with --mesh; min-insync min(2, R)) and check
    what they need: another node to follow on, a log to replicate."""
    if cfg.replication_factor is None:
        cfg.replication_factor = 2 if cfg.mesh is not None and cfg.log else 1
    r = cfg.replication_factor
    if r > 1 and cfg.mesh is None:
        raise ConfigError(f"--replication-factor: {r} needs --mesh (followers are on other nodes)")
    if r > 1 and not cfg.log:
        raise ConfigError(f"--replication-factor: {r} needs --log on (the log is what is replicated)")
    if cfg.min_insync is None:
        cfg.min_insync = min(2, r)
    elif cfg.min_insync > r:
        raise ConfigError(f"--min-insync: {cfg.min_insync} is more than --replication-factor {r}")


def _check_agreement(cfg: Config) -> None:
    """Agreement's members authenticate with a password derived from the mesh key, and name each
    other by their addresses: a wildcard names nobody. This node's own address among the peers is
    left out (one list for every node, as a StatefulSet or a compose anchor gives it)."""
    if cfg.agreement is None:
        if cfg.agreement_peer:
            raise ConfigError("--agreement-peer: needs --agreement HOST:PORT (where this node's Raft member "
                              "listens)")
        return
    shown = _joined(cfg.agreement)
    if cfg.mesh is None or not cfg.mesh_key:
        raise ConfigError(f"--agreement: {shown} needs --mesh and --mesh-key FILE (the members' password "
                          "comes from the mesh key)")
    if cfg.agreement[0] in WILDCARDS:
        raise ConfigError(f"--agreement: {shown} is no address another node can reach: give this node's "
                          "address (the members name each other by it)")
    cfg.agreement_peer = tuple(dict.fromkeys(p for p in cfg.agreement_peer if p != cfg.agreement))


def _joined(address: tuple[str, int]) -> str:
    return f"[{address[0]}]:{address[1]}" if ":" in address[0] else f"{address[0]}:{address[1]}"


def _check_ports(cfg: Config) -> None:
    """The rules between port options (one option's own rules are its ``check``): a range of one port
    per worker must end by 65535, and no two listeners of the node may share a port on one address."""
    used: list[tuple[str, str, range]] = [("--listen", x.host, range(x.port, x.port + 1))
                                          for x in cfg.listeners or [_listeners.DEFAULT]]
    if cfg.mesh is not None:
        used.append(("--mesh", cfg.mesh[0], range(cfg.mesh[1], cfg.mesh[1] + cfg.workers)))
    if cfg.stats_port:
        used.append(("--stats-port", cfg.stats_host, range(cfg.stats_port, cfg.stats_port + cfg.workers)))
    if cfg.metrics_port:
        used.append(("--metrics-port", cfg.metrics_host, range(cfg.metrics_port, cfg.metrics_port + 1)))
    if cfg.agreement is not None:
        used.append(("--agreement", cfg.agreement[0], range(cfg.agreement[1], cfg.agreement[1] + 1)))
    for i, (flag, addr, ports) in enumerate(used):
        if ports[-1] > 65535:
            raise ConfigError(f"{flag}: ports {ports[0]}-{ports[-1]} (one per worker, {cfg.workers} workers) "
                              "go beyond 65535")
        for other, other_addr, other_ports in used[:i]:
            shared = set(ports) & set(other_ports)
            if shared and (addr == other_addr or addr in WILDCARDS or other_addr in WILDCARDS):
                raise ConfigError(f"{flag}: port {min(shared)} is also used by {other}")



def _toml_listeners(table: Mapping[str, Any], raw: Any, config_file: str) -> tuple[Any, ...]:
    """The TOML file's listeners: its ``listen`` key's, then one per ``[[listener]]`` table."""
    def convert(name: str, value: Any, where: str) -> Any:
        opt = _BY_NAME[name]  # (``from_table`` passes the names of ``listeners.TABLE_KEYS``: options all)
        if name == "listen":
            if not isinstance(value, str):
                raise ConfigError(f"{where}: expected one URL, such as \"mqtts://0.0.0.0:8883\"")
            return _convert(opt, value, where)[0]
        return _convert(opt, value, where)  # the global option's type and checks

    tables = raw if isinstance(raw, list) else [raw]
    listens = list(_convert(_BY_NAME["listen"], table["listen"], f"{config_file}: listen")) if "listen" in table else []
    try:
        listens += [_listeners.from_table(t, f"{config_file}: [[listener]] {i + 1}", convert)
                    for i, t in enumerate(tables)]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return tuple(listens)


def _shown_default(opt: Option) -> str:
    """An option's default as a user writes it ('' when there is none)."""
    d = opt.default
    if d in (None, ()):
        return ""
    if opt.name == "listen":
        return ", ".join(x.url for x in d)
    if opt.name == "mesh":
        return f"{d[0]}:{d[1]}"
    if opt.type is on_off:
        return "on" if d else "off"
    return str(d)
