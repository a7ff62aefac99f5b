"""sd_notify without systemd: a datagram socket bound by the test stands for NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket
import tempfile

from brokerd.cluster.notify import notify


def test_notify_path_socket():
    with tempfile.TemporaryDirectory(dir="/tmp") as d:  # a unix socket path must stay short
        path = os.path.join(d, "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
            server.bind(path)
            server.settimeout(5)
            assert notify("READY=1\nSTATUS=ok", path)
            assert server.recv(4096) == b"READY=1\nSTATUS=ok"


def test_notify_abstract_socket():
    name = f"@brokerd-test-{os.getpid()}-{os.urandom(4).hex()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name[1:])
        server.settimeout(5)
        assert notify("STOPPING=1", name)
        assert server.recv(4096) == b"STOPPING=1"


def test_notify_without_socket_sends_nothing(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False
    assert notify("READY=1", "relative/path") is False  # neither a path nor an abstract name
    assert notify("READY=1", "/nonexistent/notify") is False  # never an error of the broker's
