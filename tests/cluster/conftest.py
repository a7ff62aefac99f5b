"""Cluster test helpers: which worker holds a connection, and clients spread over workers."""

from __future__ import annotations

import psutil

from tests.helpers import Broker, Client


def worker_of(broker: Broker, local_port: int) -> int:
    """The pid of the worker that accepted the client connection from ``local_port``."""
    for pid in broker.workers():
        try:
            for c in psutil.Process(pid).net_connections(kind="tcp"):
                if c.raddr and c.raddr.port == local_port and c.laddr.port == broker.port:
                    return pid
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no worker holds the connection from port {local_port}")


def client_worker(broker: Broker, client: Client) -> int:
    return worker_of(broker, client.c.socket().getsockname()[1])


def spread(broker: Broker, prefix: str, n: int, **kwargs) -> tuple[list[Client], dict[int, list[Client]]]:
    """Connect ``n`` clients and group them by the worker the kernel gave each."""
    clients = [Client(broker.port, f"{prefix}{i}", host=broker.host, **kwargs).connect() for i in range(n)]
    by_worker: dict[int, list[Client]] = {}
    for c in clients:
        by_worker.setdefault(client_worker(broker, c), []).append(c)
    return clients, by_worker
