"""Partitions between nodes on loopback, without privileges: a TCP proxy in front of each node's
mesh (the node advertises the proxy with ``--mesh-advertise``; its own connections leave from its
``--mesh`` address, so the proxy knows which node a connection comes from). ``cut`` stops
forwarding, both ways, on the connections from the given addresses, as a network that drops
their packets: nothing is closed, bytes wait in the kernel's buffers and TCP's retransmissions,
and flow again when the partition heals (``heal``). A connection that one side closes (a node that
dies) is closed on the other side too, as a direct one would be."""

from __future__ import annotations

import socket
import threading


class MeshProxy:
    """Forwards ``host:port`` (where other nodes connect) to ``host:target`` (the node's mesh)."""

    def __init__(self, host: str, target: int, port: int = 0) -> None:
        self.host, self.target = host, target
        self.server = socket.create_server((host, port))
        self.port = self.server.getsockname()[1]
        self.cut_from: set[str] = set()
        self.cond = threading.Condition()
        self.closed = False
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self, addresses: set[str]) -> None:
        with self.cond:
            self.cut_from = set(addresses)

    def heal(self) -> None:
        with self.cond:
            self.cut_from = set()
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.server.close()
        for s in self.conns:
            s.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                down, (source, _) = self.server.accept()
            except OSError:
                return
            try:
                up = socket.create_connection((self.host, self.target), timeout=5)
            except OSError:
                down.close()
                continue
            up.settimeout(None)
            self.conns += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(a, b, source), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, source: str) -> None:
        while True:
            with self.cond:  # bounded: the test heals or closes every proxy it cut
                self.cond.wait_for(lambda: self.closed or source not in self.cut_from)
                if self.closed:
                    return
            try:
                data = src.recv(65536)
                if data:
                    dst.sendall(data)
                    continue
            except OSError:
                pass
            # One side closed or failed (a node died): close both, as a direct connection would
            # be, so the other side's ZeroMQ reconnects (to the node's next incarnation) instead
            # of writing into a connection nobody reads.
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the other direction's recv
                except OSError:
                    pass
                sock.close()
            return
