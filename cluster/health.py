"""`brokerd health`: does the local broker answer MQTT? Exit 0 if it does, 1 if not.

For container HEALTHCHECKs, Kubernetes probes and scripts: it connects to the broker's MQTT listener
(found from the broker's own options: ``--listen``/``--port`` or ``--config FILE``; a wildcard
address means loopback), sends an MQTT 3.1.1 CONNECT with a clean session, and expects CONNACK 0,
then disconnects. A port that accepts but does not answer (a hung worker), a refused CONNECT (at
``--max-connections``, or the open-files limit) and a closed port are all unhealthy, each said in
one line on stderr. CONNACK 0x04 / 0x05 (bad credentials, not authorized: the probe is anonymous,
and a listener that is not on loopback, or has a password file, refuses anonymous clients) is
healthy: the router read the CONNECT and answered it. Bounded by ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

from .config import ConfigError, load

CONNACK_CODES = {1: "unacceptable protocol version", 2: "identifier rejected", 3: "server unavailable",
                 4: "bad user name or password", 5: "not authorized"}
HEALTHY_CODES = (0, 4, 5)  # accepted, or refused for who the (anonymous) probe is: the broker works


def connect_packet(client_id: str, keepalive: int = 10) -> bytes:
    """An MQTT 3.1.1 CONNECT, clean session, no will or credentials."""
    cid = client_id.encode()
    var = b"\x00\x04MQTT\x04\x02" + keepalive.to_bytes(2, "big")
    body = var + len(cid).to_bytes(2, "big") + cid
    return bytes([0x10, len(body)]) + body


def probe(host: str, port: int, timeout: float) -> str | None:
    """None when ``host:port`` answers a CONNECT with CONNACK 0; else what went wrong."""
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(connect_packet(f"brokerd-health-{os.getpid()}-{os.urandom(4).hex()}"))
            data = b""
            while len(data) < 4:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = s.recv(4 - len(data))
                if not chunk:
                    return "the connection was closed before CONNACK"
                data += chunk
            if data[0] != 0x20 or data[1] != 2:
                return f"expected CONNACK, got {data.hex()}"
            if data[3] not in HEALTHY_CODES:
                return f"CONNACK refused: {CONNACK_CODES.get(data[3], data[3])}"
            s.sendall(b"\xe0\x00")  # DISCONNECT
    except TimeoutError:
        return f"no CONNACK within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def main(argv: list[str]) -> int:
    own = argparse.ArgumentParser(prog="brokerd health", description=__doc__.split("\n")[0],
                                  epilog="Other options are the broker's (--listen, --port, --config ...).")
    own.add_argument("--timeout", type=float, default=3.0, metavar="SECONDS",
                     help="how long to wait for CONNACK (default 3)")
    args, rest = own.parse_known_args(argv)
    try:
        config = load(rest)
    except ConfigError as exc:
        print(f"brokerd health: error: {exc}", file=sys.stderr)
        return 2
    host, port = next((x.address for x in config.listeners if x.scheme == "mqtt"), config.listen)  # plain MQTT
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    problem = probe(host, port, args.timeout)
    if problem is not None:
        print(f"brokerd health: {shown}: {problem}", file=sys.stderr)
        return 1
    print(f"brokerd health: {shown}: ok")
    return 0
