"""scripts/agreement_bench's mass failover on etcd (Debian's etcd-server), for comparison.

Three etcd members on 127.0.0.1, their data on /dev/shm: etcd fsyncs its log at every entry,
and the PySyncObj run keeps its log in memory, so tmpfs compares the engines, not the disks.
A session's record is the key ``session/<client id>``, its value the owner, its epoch the key's
mod_revision; a move is a transaction (mod_revision still the one read, then put), a batch one
transaction (etcd's are all-or-nothing). Talks to etcd's JSON gateway (/v3/...) with urllib.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import psutil

TIMEOUT = 60.0
ATTEMPT = 1.0  # a request unanswered this long is sent again: etcd holds one sent to a dead leader ~7 s


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _call(endpoint: str, path: str, body: dict, timeout: float = 10.0) -> dict:
    request = urllib.request.Request(endpoint + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return json.loads(r.read())


def txn(endpoint: str, moves: list[tuple[str, int, str]]) -> bool:
    """Commit ``moves`` (key, mod_revision read, new owner) as one transaction, again until an answer.
    A repeat of one that did commit answers False: the caller counts the records, not the answers."""
    body = {"compare": [{"key": _b64(k), "target": "MOD", "result": "EQUAL", "mod_revision": str(rev)}
                        for k, rev, _ in moves],
            "success": [{"request_put": {"key": _b64(k), "value": _b64(owner)}} for k, _, owner in moves]}
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            return bool(_call(endpoint, "/v3/kv/txn", body, ATTEMPT).get("succeeded", False))
        except (urllib.error.URLError, OSError):  # no leader yet, or the leader lost: as a client would
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def revisions(endpoint: str, prefix: str) -> dict[str, int]:
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    r = _call(endpoint, "/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(end), "keys_only": True}, 60.0)
    return {base64.b64decode(kv["key"]).decode(): int(kv["mod_revision"]) for kv in r.get("kvs", [])}


def _claim(endpoint: str, moves: list, batch: int, inflight: int, conn) -> None:
    batches = [moves[i:i + batch] for i in range(0, len(moves), batch)]
    committed: list[float] = []
    conn.recv()  # go: the node is killed
    started = time.monotonic()

    def one(b: list) -> int:
        ok = txn(endpoint, b)
        committed.append(time.monotonic())
        return len(b) if ok else 0

    with concurrent.futures.ThreadPoolExecutor(inflight) as pool:
        ok = sum(pool.map(one, batches))
    conn.send({"ok": ok, "wall": time.monotonic() - started, "first": started, "first_commit": min(committed)})


class Etcd:
    def __init__(self, names: list[str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="agreement-etcd-", dir="/dev/shm")
        peer = {n: f"http://127.0.0.1:{_port()}" for n in names}
        self.endpoint = {n: f"http://127.0.0.1:{_port()}" for n in names}
        cluster = ",".join(f"{n}={u}" for n, u in peer.items())
        self.proc = {}
        for n in names:
            self.proc[n] = subprocess.Popen(
                ["etcd", "--name", n, "--data-dir", os.path.join(self.dir, n),
                 "--listen-client-urls", self.endpoint[n], "--advertise-client-urls", self.endpoint[n],
                 "--listen-peer-urls", peer[n], "--initial-advertise-peer-urls", peer[n],
                 "--initial-cluster", cluster, "--initial-cluster-token", "bench",
                 "--initial-cluster-state", "new", "--max-txn-ops", "20000", "--log-level", "error",
                 "--logger", "zap"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def leader(self, names: list[str], timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ids = {}
            for n in names:
                try:
                    s = _call(self.endpoint[n], "/v3/maintenance/status", {}, 2.0)
                    ids[s["header"]["member_id"]] = (n, s.get("leader"))
                except (urllib.error.URLError, OSError, KeyError):
                    continue
            for _, lead in ids.values():
                if lead in ids:
                    return ids[lead][0]
            time.sleep(0.1)
        raise SystemExit("etcd: no leader elected")

    def cpu(self, name: str) -> float:
        t = psutil.Process(self.proc[name].pid).cpu_times()
        return t.user + t.system

    def close(self) -> None:
        for p in self.proc.values():
            if p.poll() is None:
                p.terminate()
                p.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _singles(endpoint: str, keys: list[str], owner: str) -> list[float]:
    latencies = []
    for k in keys:
        started = time.perf_counter()
        txn(endpoint, [(k, 0, owner)])
        latencies.append(time.perf_counter() - started)
    return latencies


def run(args, pct) -> dict:
    """The failover of agreement_bench, on etcd: the same figures, the same names."""
    names = ["n1", "n2", "n3"]
    e = Etcd(names)
    out: dict = {"engine": "etcd", "killed": args.kill, "sessions": args.sessions, "batch": args.batch,
                 "inflight": args.inflight}
    try:
        leader = e.leader(names)
        a = leader if args.kill == "leader" else next(n for n in names if n != leader)
        b, c = [n for n in names if n != a]
        keys = [f"session/client-{i}" for i in range(args.sessions)]
        started = time.monotonic()
        for i in range(0, len(keys), args.batch):
            txn(e.endpoint[a], [(k, 0, "a/0") for k in keys[i:i + args.batch]])
        out["load_s"] = round(time.monotonic() - started, 3)
        lat3 = _singles(e.endpoint[b], [f"single3/{i}" for i in range(args.singles)], "s3/0")
        out["single_3_up_ms"] = {"p50": round(pct(lat3, 50), 2), "p99": round(pct(lat3, 99), 2)}
        rev = revisions(e.endpoint[b], "session/")  # what the routers would know: the records they read
        half = args.sessions // 2
        work = {b: [(k, rev[k], "b/0") for k in keys[:half]], c: [(k, rev[k], "c/0") for k in keys[half:]]}
        cpu0 = {n: e.cpu(n) for n in (b, c)}
        pipes, procs = {}, {}
        for n in (b, c):
            pipes[n], child = mp.Pipe()
            procs[n] = mp.Process(target=_claim, args=(e.endpoint[n], work[n], args.batch, args.inflight, child))
            procs[n].start()
        time.sleep(0.5)  # the claimers' start (fork) is not the engine's
        killed = time.monotonic()
        os.kill(e.proc[a].pid, signal.SIGKILL)
        for n in (b, c):
            pipes[n].send("go")
        claims = [pipes[n].recv() for n in (b, c)]
        done = time.monotonic()
        for p in procs.values():
            p.join(10)
        cpu = {n: e.cpu(n) - cpu0[n] for n in (b, c)}
        new_leader = e.leader([b, c])
        owners = revisions(e.endpoint[c], "session/")
        out["failover"] = {
            "committed": sum(1 for k in keys if owners[k] != rev[k]),
            "from_kill_s": round(done - killed, 3),
            "first_commit_s": round(min(r["first_commit"] for r in claims) - killed, 3),
            "from_first_proposal_s": round(done - min(r["first"] for r in claims), 3),
            "cpu_s": {("leader" if n == new_leader else "follower"): round(v, 3) for n, v in cpu.items()},
            "cpu_us_per_move": round(sum(cpu.values()) / args.sessions * 1e6, 1),
            "moves_per_s": round(args.sessions / (done - killed)),
        }
        follower = c if new_leader == b else b
        lat2 = _singles(e.endpoint[follower], [f"single2/{i}" for i in range(args.singles)], "s2/0")
        out["single_2_up_ms"] = {"p50": round(pct(lat2, 50), 2), "p99": round(pct(lat2, 99), 2)}
    finally:
        e.close()
    return out
