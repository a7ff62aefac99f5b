"""A real Prometheus (Debian's package) scrapes a real `brokerd --workers 2 --metrics-port P` every second,
with deploy/prometheus/alerts.yml loaded; its HTTP API must count exactly the messages the test sent,
evaluate every alert rule without error, and know every metric the rules and the dashboard query."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.deploy.test_files import DEPLOY, alert_rules, metrics_in
from tests.helpers import LEASES, Client, cid, free_port, mesh_key, wait_for

MESSAGES = 25
BOUND_S = 20.0  # every wait for Prometheus (start, scrape, evaluation)


def _get(base: str, path: str, **params: str) -> dict:
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _value(base: str, query: str) -> float | None:
    result = _get(base, "/api/v1/query", query=query)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


@pytest.fixture
def prometheus(tmp_path: Path):
    """Start Prometheus on a free loopback port with the given scrape targets; stopped after the test."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (./scripts/test installs Debian's with apt-get as root)")
    procs: list[subprocess.Popen] = []

    def start(targets: list[str]) -> str:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(DEPLOY / "prometheus" / "alerts.yml")],
            "scrape_configs": [{"job_name": "brokerd", "static_configs": [{"targets": targets}]}],
        }))
        log = open(tmp_path / "prometheus.log", "wb")  # the child keeps its own descriptor
        procs.append(subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path))
        log.close()
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _ready(base) or procs[-1].poll() is not None, BOUND_S, "Prometheus ready")
        assert procs[-1].poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
        return base

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def test_prometheus_scrapes_brokerd_and_counts_what_was_sent(start_broker, prometheus):
    from tests.cluster.test_multihost import mesh_port

    metrics_port = free_port()
    # Node prom, scraped, with a peer node on 127.0.0.2: its logs have a follower there, so the
    # replication series the alerts use exist too.
    mesh_a, mesh_b = mesh_port("127.0.0.1"), mesh_port("127.0.0.2")
    broker = start_broker("--metrics-port", str(metrics_port), "--stats-interval", "0.5", "--mesh",
                          f"127.0.0.1:{mesh_a}", *LEASES, "--peer", f"127.0.0.2:{mesh_b}", *mesh_key(), workers=2,
                          node_id="prom")
    start_broker("--mesh", f"127.0.0.2:{mesh_b}", *LEASES, "--peer", f"127.0.0.1:{mesh_a}", *mesh_key(),
                 host="127.0.0.2", node_id="peer")
    base = prometheus([f"127.0.0.1:{metrics_port}"])

    # Subscribers on both workers (the kernel spreads connections), so messages cross the mesh too.
    subs = [Client(broker.port, cid("sub")).connect() for _ in range(4)]
    for s in subs:
        s.subscribe("deploy/#", 1)
    pub = Client(broker.port, cid("pub")).connect()
    for i in range(MESSAGES):
        pub.publish(f"deploy/{i}", b"x", qos=1)
    for s in subs:
        s.wait_messages(MESSAGES)

    received = 'sum(brokerd_client_messages_received_total{job="brokerd", node="prom"})'
    wait_for(lambda: (_value(base, received) or 0) >= MESSAGES, BOUND_S, f"Prometheus to count {MESSAGES} messages")
    assert _value(base, received) == MESSAGES
    assert _value(base, 'sum(brokerd_client_messages_sent_total{node="prom"})') == MESSAGES * len(subs)
    assert _value(base, 'count(brokerd_router_up{node="prom"} == 1)') == 2
    assert _value(base, 'up{job="brokerd"}') == 1

    # Every alert rule evaluates on the real series without error, and none fires on a healthy node.
    deadline = time.monotonic() + BOUND_S
    while True:
        rules = [r for g in _get(base, "/api/v1/rules")["data"]["groups"] for r in g["rules"]]
        if (rules and all(r["health"] != "unknown" for r in rules)) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {r["name"] for r in rules} == {r["alert"] for r in alert_rules()}
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    firing = [r["name"] for r in rules if r["state"] != "inactive"]
    assert not firing, firing

    # Every metric the rules and the dashboard query is one this broker really exports.
    wait_for(lambda: _value(base, 'count(brokerd_replica_in_sync{node="prom"} == 1)') == 2, BOUND_S,
             "both routers' followers in sync, scraped")
    scraped = set(_get(base, "/api/v1/label/__name__/values")["data"])
    used = set().union(*(metrics_in(r["expr"]) for r in alert_rules()))
    dash = json.loads((DEPLOY / "grafana" / "brokerd.json").read_text())
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            used |= metrics_in(target["expr"])
    assert used <= scraped, used - scraped
