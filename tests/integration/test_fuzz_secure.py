"""A bounded mutation fuzz of a secured broker (issue 17): TLS, a password file and an ACL, two
workers. While an authenticated QoS 1 publisher streams to an authenticated subscriber over TLS, a
seeded fuzzer sends mutated CONNECT, SUBSCRIBE and PUBLISH packets (bit flips, truncations, changed
length fields, random MQTT 5 properties, garbage) over many short plain and TLS connections.
Afterwards: every message acknowledged to the publisher reached the subscriber, both listeners still
accept authenticated clients, no worker died, and nothing in the log is a traceback.

``BROKERD_FUZZ_SEED`` replays a run (the seed is printed); ``BROKERD_FUZZ_PACKETS`` and
``BROKERD_FUZZ_SECONDS`` bound it (2000 packets, 20 s). Loopback only."""

from __future__ import annotations

import os
import random
import shutil
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import WAIT, Client, add_user, cid, free_port

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

PACKETS = int(os.environ.get("BROKERD_FUZZ_PACKETS", "2000"))
SECONDS = float(os.environ.get("BROKERD_FUZZ_SECONDS", "20"))
STREAMER_PW = "stream-pw-9"
FUZZER_PW = "fuzz-pw-3"
ACL = """
user streamer
topic readwrite stream/#
user fuzzer
topic readwrite fuzz/#
topic read stream/#
"""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("fuzz-pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=fuzz CA",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "server.key",
             "-out", "server.csr", cwd=d)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-out", "server.pem", "-extfile", "server.ext", cwd=d)
    return {n: str(d / n) for n in ("ca.pem", "server.pem", "server.key")}


# -- raw packets ------------------------------------------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = n >> 7, n & 0x7F
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _s(b: bytes) -> bytes:
    return len(b).to_bytes(2, "big") + b


def _fixed(first: int, body: bytes) -> bytes:
    return bytes([first]) + _varint(len(body)) + body


def _connect(level: int, client_id: bytes, user: bytes | None, password: bytes | None, props: bytes = b"",
             will: tuple[bytes, bytes] | None = None) -> bytes:
    flags = 0x02 | (0x80 if user is not None else 0) | (0x40 if password is not None else 0) | (0x04 if will else 0)
    vh = _s(b"MQTT" if level >= 4 else b"MQIsdp") + bytes([level, flags]) + (30).to_bytes(2, "big")
    if level == 5:
        vh += _varint(len(props)) + props
    payload = _s(client_id)
    if will:
        payload += (b"\x00" if level == 5 else b"") + _s(will[0]) + _s(will[1])
    payload += (_s(user) if user is not None else b"") + (_s(password) if password is not None else b"")
    return _fixed(0x10, vh + payload)


def _subscribe(level: int, pid: int, filters: list[tuple[bytes, int]], props: bytes = b"") -> bytes:
    vh = pid.to_bytes(2, "big") + (_varint(len(props)) + props if level == 5 else b"")
    return _fixed(0x82, vh + b"".join(_s(f) + bytes([o]) for f, o in filters))


def _publish(level: int, topic: bytes, payload: bytes, qos: int, pid: int, props: bytes = b"",
             retain: bool = False) -> bytes:
    vh = _s(topic) + (pid.to_bytes(2, "big") if qos else b"") + (_varint(len(props)) + props if level == 5 else b"")
    return _fixed(0x30 | (qos << 1) | int(retain), vh + payload)


# MQTT 5 property identifiers (and some that are none) with how long their values are.
_PROPS = {0x01: 1, 0x02: 4, 0x03: -1, 0x08: -1, 0x09: -2, 0x0B: -3, 0x11: 4, 0x12: -1, 0x15: -1, 0x16: -2,
          0x17: 1, 0x18: 4, 0x19: 1, 0x21: 2, 0x22: 2, 0x23: 2, 0x24: 1, 0x25: 1, 0x26: -4, 0x27: 4, 0x28: 1,
          0x29: 1, 0x2A: 1, 0x00: 1, 0x7F: 3, 0xFF: 2}


def _random_props(rnd: random.Random) -> bytes:
    out = bytearray()
    for _ in range(rnd.randint(1, 4)):
        ident = rnd.choice(list(_PROPS))
        kind = _PROPS[ident]
        out.append(ident)
        if kind > 0:
            out += rnd.randbytes(kind)
        elif kind == -3:  # variable byte integer, maybe 5 bytes long (invalid)
            out += bytes([0x80 | rnd.randrange(128) for _ in range(rnd.randint(0, 4))]) + bytes([rnd.randrange(128)])
        elif kind == -4:  # user property: a string pair
            out += _s(rnd.randbytes(rnd.randint(0, 6))) + _s(rnd.randbytes(rnd.randint(0, 6)))
        else:  # string or binary data, its length sometimes lying
            data = rnd.randbytes(rnd.randint(0, 8))
            out += (len(data) + rnd.choice((0, 0, 0, 1, 200))).to_bytes(2, "big") + data
    return bytes(out)


def _mutate(packet: bytes, rnd: random.Random) -> bytes:
    data = bytearray(packet)
    how = rnd.randrange(6)
    if how == 0:  # bit flips
        for _ in range(rnd.randint(1, 8)):
            i = rnd.randrange(len(data))
            data[i] ^= 1 << rnd.randrange(8)
    elif how == 1:  # truncated
        data = data[:rnd.randrange(1, len(data))]
    elif how == 2:  # remaining length changed (smaller, larger, huge, a 5-byte varint)
        end = 1
        while end < len(data) and data[end] & 0x80:
            end += 1
        choice = rnd.randrange(4)
        length = (rnd.randrange(0, 128) if choice == 0 else rnd.randrange(128, 1 << 21) if choice == 1
                  else (1 << 28) - 1 if choice == 2 else -1)
        data[1:end + 1] = b"\xff\xff\xff\xff\x7f" if length < 0 else _varint(length)
    elif how == 3:  # bytes overwritten with random ones
        for _ in range(rnd.randint(1, 4)):
            data[rnd.randrange(len(data))] = rnd.randrange(256)
    elif how == 4:  # random bytes inserted in the middle (the length no longer fits)
        i = rnd.randrange(1, len(data) + 1)
        data[i:i] = rnd.randbytes(rnd.randint(1, 16))
    else:  # the first byte (type and flags) replaced
        data[0] = rnd.randrange(256)
    return bytes(data)


class Fuzzer:
    def __init__(self, seed: int, plain: int, tls: int, ca: str) -> None:
        self.rnd = random.Random(seed)
        self.plain, self.tls = plain, tls
        self.ctx = ssl.create_default_context(cafile=ca)
        self.sent = 0
        self.connections = 0

    def _base(self, kind: str, level: int) -> bytes:
        rnd = self.rnd
        props = _random_props(rnd) if level == 5 and rnd.random() < 0.6 else b""
        if kind == "connect":
            user, password = rnd.choice(((b"fuzzer", FUZZER_PW.encode()), (b"fuzzer", b"wrong"),
                                         (b"streamer", b"nope"), (None, None), (b"nobody", b"x")))
            will = (b"fuzz/will", b"w") if rnd.random() < 0.3 else None
            return _connect(level, b"fz-" + rnd.randbytes(4).hex().encode(), user, password, props, will)
        if kind == "subscribe":
            filters = [(rnd.choice((b"fuzz/#", b"stream/#", b"#", b"$SYS/#", b"fuzz/+/x", b"$share/g/fuzz/#",
                                    b"a/#/b", b"")), rnd.randrange(256 if rnd.random() < 0.2 else 3))
                       for _ in range(rnd.randint(1, 3))]
            return _subscribe(level, rnd.randint(0, 3), filters, props)
        topic = rnd.choice((b"fuzz/t", b"stream/x", b"$SYS/x", b"fuzz/#", b"", b"fuzz/\x00", b"fuzz/" + b"l/" * 40))
        qos = rnd.randrange(3)
        return _publish(level, topic, rnd.randbytes(rnd.randint(0, 64)), qos, rnd.randint(0, 9),
                        props, retain=rnd.random() < 0.1)

    def one_connection(self) -> None:
        """One short connection: a mutated CONNECT, or a good one followed by mutated packets."""
        rnd = self.rnd
        use_tls = rnd.random() < 0.5
        level = rnd.choice((3, 4, 4, 5, 5))
        packets: list[bytes] = []
        if rnd.random() < 0.35:
            packets.append(_mutate(self._base("connect", level), rnd))
        else:
            packets.append(_connect(level, b"fz-" + rnd.randbytes(4).hex().encode(), b"fuzzer", FUZZER_PW.encode()))
            for _ in range(rnd.randint(1, 6)):
                base = self._base(rnd.choice(("subscribe", "publish", "publish", "connect")), level)
                packets.append(_mutate(base, rnd) if rnd.random() < 0.85 else base)
        sock = socket.create_connection(("127.0.0.1", self.tls if use_tls else self.plain), timeout=5)
        try:
            if use_tls:
                sock = self.ctx.wrap_socket(sock, server_hostname="127.0.0.1")
            together = rnd.random() < 0.5
            if together:
                sock.sendall(b"".join(packets))
            else:
                for p in packets:
                    sock.sendall(p)
            self.sent += len(packets)
            sock.settimeout(0.01 if rnd.random() < 0.7 else 0.1)
            try:
                sock.recv(65536)
            except (TimeoutError, OSError):
                pass
            if rnd.random() < 0.2:  # sometimes an abrupt end (RST)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except (OSError, ssl.SSLError):
            pass  # the broker closed it: fine
        finally:
            sock.close()
            self.connections += 1

    def run(self, packets: int, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.sent < packets and time.monotonic() < deadline:
            self.one_connection()


class Stream:
    """An authenticated QoS 1 publisher streaming to an authenticated subscriber, both over TLS: what
    was acknowledged to the publisher, and what the subscriber received."""

    def __init__(self, tls: int, ca: str) -> None:
        self.sub = self._client(tls, ca, "fz-sub", clean=False)
        self.sub.connect()
        assert self.sub.subscribe("stream/#", 1) == [1]
        self.pub = self._client(tls, ca, "fz-pub").connect()
        self.acked: list[int] = []
        self.unacked: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _client(port: int, ca: str, name: str, clean: bool = True) -> Client:
        c = Client(port, cid(name), clean=clean)
        c.c.tls_set(ca_certs=ca)
        c.c.username_pw_set("streamer", STREAMER_PW)
        return c

    def _run(self) -> None:
        seq = 0
        while not self.stop.is_set():
            info = self.pub.c.publish("stream/x", str(seq).encode(), 1)
            info.wait_for_publish(10)
            (self.acked if info.is_published() else self.unacked).append(seq)
            seq += 1
            time.sleep(0.002)

    def received(self) -> set[int]:
        with self.sub.cond:
            return {int(m.payload) for m in self.sub.messages}


def test_mutation_fuzz_of_a_secured_broker_loses_nothing_acknowledged(start_broker, pki, tmp_path):
    seed = int(os.environ.get("BROKERD_FUZZ_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"fuzz seed {seed} (BROKERD_FUZZ_SEED={seed} replays it)")
    pw, acl = tmp_path / "passwd", tmp_path / "acl"
    add_user(pw, "streamer", STREAMER_PW)
    add_user(pw, "fuzzer", FUZZER_PW)
    acl.write_text(ACL)
    tls = free_port()
    broker = start_broker("--listen", f"mqtts://127.0.0.1:{tls}", "--certfile", pki["server.pem"],
                          "--keyfile", pki["server.key"], "--password-file", str(pw), "--acl-file", str(acl),
                          workers=2)
    listeners = {"mqtt": broker.port, "mqtts": tls}
    supervisor = psutil.Process(broker.pid)
    children = {p.pid for p in supervisor.children()}
    stream = Stream(tls, pki["ca.pem"])
    stream.thread.start()
    fuzzer = Fuzzer(seed, broker.port, tls, pki["ca.pem"])
    started = time.monotonic()
    try:
        fuzzer.run(PACKETS, SECONDS)
    finally:
        took = time.monotonic() - started
        time.sleep(0.5)
        stream.stop.set()
        stream.thread.join(15)
    print(f"fuzz seed {seed}: {fuzzer.sent} packets over {fuzzer.connections} connections in {took:.1f} s; "
          f"{len(stream.acked)} messages acknowledged to the publisher")
    assert len(stream.acked) >= 20, "the stream hardly ran"
    deadline = time.monotonic() + WAIT
    while not set(stream.acked) <= stream.received() and time.monotonic() < deadline:
        time.sleep(0.1)
    lost = sorted(set(stream.acked) - stream.received())
    assert not lost, f"seed {seed}: {len(lost)} acknowledged messages never delivered, first {lost[:10]}"
    assert not stream.pub.disconnected.is_set() and not stream.sub.disconnected.is_set(), f"seed {seed}"
    # Every listener still takes authenticated clients, and they talk to each other.
    ca = pki["ca.pem"]
    for scheme, port in listeners.items():
        for _ in range(4):  # both workers, most likely (SO_REUSEPORT spreads them)
            c = Client(port, cid(f"after-{scheme}"))
            if scheme == "mqtts":
                c.c.tls_set(ca_certs=ca)
            c.c.username_pw_set("fuzzer", FUZZER_PW)
            c.connect()
            assert c.subscribe(f"fuzz/after/{scheme}", 1) == [1]
            c.publish(f"fuzz/after/{scheme}", b"alive", 1)
            assert c.wait_messages(1)[0].payload == b"alive"
            c.disconnect()
        bad = Client(port, cid("after-bad"))
        if scheme == "mqtts":
            bad.c.tls_set(ca_certs=ca)
        bad.c.username_pw_set("fuzzer", "wrong")
        bad.connect(expect_rc=0x86)
    assert {p.pid for p in supervisor.children()} == children, f"seed {seed}: a broker process was restarted"
    assert supervisor.is_running()
    text = broker.log_text()
    assert "Traceback" not in text, f"seed {seed}: " + text[text.index("Traceback") - 2000:][:6000]
    Client.close_all([stream.pub, stream.sub])
