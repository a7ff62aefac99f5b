"""What one client can make its connection hold: a client that never reads costs the worker at most
its output buffer (``--max-client-buffer``), whatever packets it sends, and nobody else waits for it."""

from __future__ import annotations

import socket
import time

from tests.helpers import Client, cid, connect_packet

MIB = 1 << 20


def _rss(pid: int) -> int:
    """The resident set of process ``pid``, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _flood_without_reading(port: int, data: bytes, total: int, give_up_s: float) -> tuple[socket.socket, int]:
    """Connect, CONNECT, then send ``data`` over and over, ``total`` bytes at most, never reading; a
    send blocked for ``give_up_s`` ends it (the broker stopped reading). Returns the socket and the
    bytes sent."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # what it is sent stays in the broker
    sock.sendall(connect_packet(cid("flood")))
    sock.settimeout(give_up_s)
    sent = 0
    while sent < total:
        try:
            sent += sock.send(data)
        except TimeoutError:
            break
    return sock, sent


def test_a_client_that_sends_pingreqs_and_never_reads_costs_at_most_its_output_buffer(start_broker):
    """10 MiB of PINGREQ, the PINGRESPs never read: the worker stops reading the client once its
    output backs up (it read all of it and grew by 85 MiB before), and a client beside it is
    served at once."""
    limit = MIB  # the default --max-client-buffer
    broker = start_broker("--log", "off", workers=1)  # one worker: its memory is what is measured
    [worker] = broker.workers()
    before = _rss(worker)
    flood, sent = _flood_without_reading(broker.port, b"\xc0\x00" * 32768, 10 * MIB, give_up_s=2.0)
    peak = before
    deadline = time.monotonic() + 3.0  # what it sent has been read and answered by then, if it is read
    while time.monotonic() < deadline:
        peak = max(peak, _rss(worker))
        time.sleep(0.05)
    assert peak - before < 2 * limit + 10 * MIB, (
        f"{sent / MIB:.1f} MiB sent: the worker grew by {(peak - before) / MIB:.1f} MiB")
    other = Client(broker.port, cid("beside")).connect()
    other.subscribe("bp/t", 1)
    start = time.monotonic()
    other.publish("bp/t", b"served", qos=1)
    assert other.wait_payload(b"served", timeout=3.0)
    assert time.monotonic() - start < 3.0
    flood.close()
