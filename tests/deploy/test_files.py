"""deploy/ without running it: the systemd unit (systemd-analyze), the Kubernetes manifests (the
Kubernetes schemas, offline), the alert rules (promtool), the compose file, the Dockerfile, the Grafana
dashboard, and that they all name real options and real metrics."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from brokerd.cluster.config import OPTIONS, load
from brokerd.cluster.stats import DROP_REASONS
from tests.helpers import BROKERD, ROOT

DEPLOY = ROOT / "deploy"
OPTION_VARS = {"BROKERD_" + o.name.upper(): o for o in OPTIONS}
OTHER_VARS = {"BROKERD_CONFIG", "BROKERD_PORT", "BROKERD_RUN_DIR"}  # not options, still brokerd's


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (./scripts/test installs it with apt-get as root)")
    return path


def exported_metrics() -> set[str]:
    """Every series name cluster/metrics.py exports: its metric names, counters also with _total
    (what Prometheus stores). The live test (test_prometheus.py) checks against a real scrape."""
    names = set(re.findall(r'"(brokerd_[a-z_]+)"', (ROOT / "cluster" / "metrics.py").read_text()))
    return names | {n + "_total" for n in names}


def metrics_in(expr: str) -> set[str]:
    return set(re.findall(r"\b(brokerd_[a-z_]+)", expr))


def options_argv(env: dict[str, str]) -> list[str]:
    """BROKERD_* variables as the equivalent flags (a repeatable option's list split on commas)."""
    argv: list[str] = []
    for var, value in env.items():
        opt = OPTION_VARS[var]
        for item in value.split(",") if opt.repeat else [value]:
            argv += [opt.flag, item]
    return argv


# -- systemd ------------------------------------------------------------------------------------------

def _unit(tmp_path: Path) -> Path:
    """The unit as installed, with ExecStart pointing at this checkout's brokerd (verify wants it)."""
    text = (DEPLOY / "brokerd.service").read_text()
    assert "ExecStart=/opt/brokerd/.venv/bin/brokerd " in text
    unit = tmp_path / "brokerd.service"
    unit.write_text(text.replace("/opt/brokerd/.venv/bin/brokerd", BROKERD))
    return unit


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in (DEPLOY / "brokerd.service").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_systemd_unit_verifies(tmp_path):
    tool = _tool("systemd-analyze")
    unit = _unit(tmp_path)
    out = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and not out.stderr.strip() and not out.stdout.strip(), out.stderr + out.stdout


def test_systemd_unit_is_hardened(tmp_path):
    s = unit_settings()
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    assert s["StateDirectory"] == ["brokerd"] and s["RuntimeDirectory"] == ["brokerd"]
    assert "BROKERD_RUN_DIR=%t/brokerd" in s["Environment"]
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                       "PrivateTmp": "yes", "CapabilityBoundingSet": ""}.items():
        assert s[key] == [value], key
    assert "@system-service" in s["SystemCallFilter"]
    assert set(s["RestrictAddressFamilies"][0].split()) <= {"AF_INET", "AF_INET6", "AF_UNIX", "AF_NETLINK"}
    assert s["User"] == ["brokerd"] and s["KillSignal"] == ["SIGTERM"] and s["LimitNOFILE"]
    # systemd's own score of the sandbox: exposure at most 2.0 of 10 ("OK").
    tool = _tool("systemd-analyze")
    out = subprocess.run([tool, "security", "--offline=yes", "--threshold=20", str(_unit(tmp_path))],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr


def test_example_config_is_valid():
    config = load(["--config", str(DEPLOY / "brokerd.toml")])
    assert config.data_dir == "/var/lib/brokerd/data" and config.metrics_port
    # Reachable from other hosts, for the users of a password file the hardened unit can read.
    assert [x.url for x in config.listeners] == ["mqtt://0.0.0.0:1883"]
    assert not config.listeners[0].allow_anonymous and config.password_file.startswith("/etc/brokerd/")


# -- Prometheus and Grafana ---------------------------------------------------------------------------

def test_promtool_checks_rules_config_and_rule_tests():
    tool = _tool("promtool")
    for args in (["check", "rules", "alerts.yml"], ["check", "config", "prometheus.yml"],
                 ["test", "rules", "alerts_test.yml"]):
        out = subprocess.run([tool, *args], capture_output=True, text=True, timeout=60, cwd=DEPLOY / "prometheus")
        assert out.returncode == 0, f"promtool {' '.join(args)}:\n{out.stdout}{out.stderr}"


def alert_rules() -> list[dict]:
    doc = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_alert_rules_cover_the_failures_and_name_real_metrics():
    rules = alert_rules()
    names = {r["alert"] for r in rules}
    assert {"BrokerdDown", "BrokerdRouterDown", "BrokerdWorkerRestarted", "BrokerdMessagesLostForSilentPeer",
            "BrokerdMessagesDropped", "BrokerdCommitLogStalled", "BrokerdEventLoopLag",
            "BrokerdConnectionsRefused", "BrokerdConnectionsNearLimit"} <= names
    exported = exported_metrics()
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        assert metrics_in(rule["expr"]) <= exported, (rule["alert"], metrics_in(rule["expr"]) - exported)
        for reason in re.findall(r'reason!?="([a-z_]+)"', rule["expr"]):
            assert reason in DROP_REASONS, (rule["alert"], reason)


def test_grafana_dashboard_queries_real_metrics():
    dash = json.loads((DEPLOY / "grafana" / "brokerd.json").read_text())
    assert dash["uid"] == "brokerd" and dash["title"] == "brokerd"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(panels) >= 10 and len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    exported, used = exported_metrics(), set()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = metrics_in(target["expr"])
            assert names and names <= exported, (panel["title"], names - exported)
            used |= names
    # What an operator looks at first is on it.
    assert {"brokerd_clients_connected", "brokerd_client_messages_received_total",
            "brokerd_dropped_messages_total", "brokerd_event_loop_lag_seconds", "brokerd_router_up",
            "brokerd_mesh_messages_sent_total", "brokerd_log_size_bytes"} <= used
    provisioning = DEPLOY / "grafana" / "provisioning"
    for f in ("datasources/prometheus.yml", "dashboards/brokerd.yml"):
        assert yaml.safe_load((provisioning / f).read_text())["apiVersion"] == 1


# -- Kubernetes -----------------------------------------------------------------------------------------

def k8s_resources() -> list[dict]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


@pytest.mark.parametrize("version", ["1.28.0", "latest"])
def test_kubernetes_manifests_validate_against_the_schemas(version):
    kv = pytest.importorskip("kubernetes_validate")
    from kubernetes_validate.utils import latest_version

    version = latest_version() if version == "latest" else version
    kinds = []
    for doc in k8s_resources():
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: no schema offline, checked field by field below
        kv.validate(doc, version, strict=True)  # raises with the path of the first wrong field
        kinds.append(doc["kind"])
    assert sorted(kinds) == ["PodDisruptionBudget", "Service", "Service", "StatefulSet"]


def test_kubernetes_manifests_fit_together():
    by_kind: dict[str, list[dict]] = {}
    for doc in k8s_resources():
        by_kind.setdefault(doc["kind"], []).append(doc)
    (sts,) = by_kind["StatefulSet"]
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    services = {s["metadata"]["name"]: s for s in by_kind["Service"]}
    headless = services[sts["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    for svc in services.values():
        assert svc["spec"]["selector"].items() <= pod_labels.items()
    (pdb,) = by_kind["PodDisruptionBudget"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()

    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for svc in services.values():
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, (svc["metadata"]["name"], port)
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= container.keys()
    assert container["readinessProbe"]["exec"]["command"][:2] == ["brokerd", "health"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["tmp"] == "/tmp"  # the run directory on a read-only root
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert mounts[claim["metadata"]["name"]] == "/data"

    # Options from the environment: real option names and values; the node id is the pod's name;
    # the peers are the StatefulSet's pods by their headless DNS names.
    env = {e["name"]: e for e in container["env"]}
    assert set(env) <= OPTION_VARS.keys()
    assert env["BROKERD_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    values = {k: e["value"] for k, e in env.items() if "value" in e}
    config = load(options_argv(values))
    assert config.data_dir == mounts["data"] and config.metrics_port == ports["metrics"]
    assert config.mesh == ("0.0.0.0", ports["mesh"]) and config.mesh_key.startswith(mounts["mesh-key"] + "/")
    name, svc, replicas = sts["metadata"]["name"], headless["metadata"]["name"], sts["spec"]["replicas"]
    assert config.peer == tuple((f"{name}-{i}.{svc}", ports["mesh"]) for i in range(replicas))
    # Agreement: this pod by its DNS name (Kubernetes expands the node id), one list of members.
    assert values["BROKERD_AGREEMENT"] == f"$(BROKERD_NODE_ID).{svc}:{ports['agreement']}"
    assert list(env).index("BROKERD_NODE_ID") < list(env).index("BROKERD_AGREEMENT")  # (expanded in order)
    pod0 = load(options_argv({**values, "BROKERD_AGREEMENT": f"{name}-0.{svc}:{ports['agreement']}"}))
    assert pod0.agreement_peer == tuple((f"{name}-{i}.{svc}", ports["agreement"]) for i in range(1, replicas))

    (monitor,) = by_kind["ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= headless["metadata"]["labels"].items()
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= services["brokerd"]["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in headless["spec"]["ports"]} and endpoint["path"] == "/metrics"
    assert headless["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "brokerd"  # alerts.yml's job


# -- compose and the image ----------------------------------------------------------------------------

def test_compose_file():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services, volumes = compose["services"], compose["volumes"]
    assert {"a", "b", "c", "prometheus", "grafana", "mesh-key"} <= services.keys()
    for name in ("a", "b", "c"):
        node = services[name]
        assert node["restart"] in ("always", "unless-stopped"), name
        assert node["healthcheck"]["test"][:3] == ["CMD", "brokerd", "health"], name
        assert node["depends_on"]["mesh-key"]["condition"] == "service_completed_successfully"
        mounts = dict(v.split(":")[:2] for v in node["volumes"])
        assert mounts[f"{name}-data"] == "/data" and mounts["mesh-key"] == "/keys"
        assert {f"{name}-data", "mesh-key"} <= volumes.keys()
        env = node["environment"]
        assert set(env) <= OPTION_VARS.keys(), name
        config = load(options_argv(env))
        assert config.node_id == name == node["hostname"] and config.mesh == (name, 7000)
        assert config.mesh_key.startswith("/keys/") and config.metrics_port == 9883
        assert all(host in ("a", "b", "c") and host != name for host, _ in config.peer)
        # Session ownership agreed by the three nodes' Raft members, each given the others.
        assert config.agreement == (name, 7100)
        assert sorted(config.agreement_peer) == [(n, 7100) for n in "abc" if n != name]
    keygen = " ".join(services["mesh-key"]["entrypoint"])
    assert "brokerd keygen --out /keys/cluster" in keygen and "chown 10001" in keygen
    prometheus = services["prometheus"]
    assert "prometheus-data:/prometheus" in prometheus["volumes"] and prometheus["healthcheck"]
    for service in ("prometheus", "grafana"):
        for volume in services[service]["volumes"]:
            source = volume.split(":")[0]
            assert source in volumes or (DEPLOY / source).exists(), (service, volume)
    targets = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())["scrape_configs"][0]
    assert targets["job_name"] == "brokerd"
    assert targets["static_configs"][0]["targets"] == [f"{n}:9883" for n in ("a", "b", "c")]


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile():
    steps = dockerfile()
    stages = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    final = steps[stages[-1]:]
    words = [w for w, _ in final]
    user = [arg for w, arg in final if w == "USER"][-1]
    assert user.split(":")[0] not in ("root", "0"), user
    assert user.split(":")[0] == "10001"  # the k8s runAsUser and compose's chown
    assert words.index("USER") > max(i for i, w in enumerate(words) if w == "RUN")  # nothing runs as root after
    health = next(arg for w, arg in final if w == "HEALTHCHECK")
    assert "--interval=" in health and '"brokerd", "health"' in health
    assert ("VOLUME", "/data") in final
    exposed = " ".join(arg for w, arg in final if w == "EXPOSE").split()
    assert {"1883", "7100", "9883"} <= set(exposed)  # (7100: the agreement, as compose and the StatefulSet)
    assert json.loads(next(arg for w, arg in final if w == "ENTRYPOINT")) == ["brokerd"]
    env = image_env()
    assert env == {"BROKERD_LISTEN": "mqtt://0.0.0.0:1883", "BROKERD_PASSWORD_FILE": "/run/secrets/brokerd-passwd",
                   "BROKERD_RETENTION_BYTES": "1G", "BROKERD_DATA_DIR": "/data", "BROKERD_METRICS_PORT": "9883",
                   "BROKERD_METRICS_HOST": "0.0.0.0"}
    assert set(env) <= OPTION_VARS.keys()
    # What it copies exists and .dockerignore lets it into the build context; .git and .venv stay out.
    ignore = [line for line in (ROOT / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for word, arg in steps:
        if word == "COPY" and not arg.startswith("--from"):
            for source in arg.split()[:-1]:
                assert (ROOT / source).exists() and source.rstrip("/") in allowed, source
    assert not {".git", ".venv", "tests", "data"} & allowed


# -- what every deployment serves: the network, for the users of a mounted secret ------------------------

def image_env() -> dict[str, str]:
    """The BROKERD_* variables the image sets (its final stage's ENV)."""
    steps = dockerfile()
    final = steps[[i for i, (word, _) in enumerate(steps) if word == "FROM"][-1]:]
    return dict(re.findall(r"(BROKERD_[A-Z_]+)=(\S+)", " ".join(arg for w, arg in final if w == "ENV")))


def compose_env(node: str) -> dict[str, str]:
    """A compose node's options: the image's variables, overlaid by the service's environment."""
    service = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"][node]
    return {**image_env(), **{k: str(v) for k, v in service["environment"].items()}}


def statefulset() -> dict:
    return next(d for d in k8s_resources() if d["kind"] == "StatefulSet")


def k8s_env() -> dict[str, str]:
    """The StatefulSet's options: the image's variables, overlaid by the container's values (the node
    id, from the pod's name, is left to default)."""
    (container,) = statefulset()["spec"]["template"]["spec"]["containers"]
    return {**image_env(), **{e["name"]: e["value"] for e in container["env"] if "value" in e}}


DEPLOYMENTS = {"image": image_env, "compose": lambda: compose_env("a"), "kubernetes": k8s_env}


def _serves_the_network_for_users(config, port: int = 1883) -> None:
    assert [x.url for x in config.listeners] == [f"mqtt://0.0.0.0:{port}"]  # not loopback only
    assert not config.listeners[0].allow_anonymous and config.password_file


def test_the_image_listens_on_every_address_for_the_users_of_a_secret():
    config = load([], environ=image_env())
    _serves_the_network_for_users(config)
    assert config.password_file == "/run/secrets/brokerd-passwd"  # where compose puts its secrets


def test_compose_nodes_listen_for_the_users_of_the_compose_secret_and_fit_their_disk():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    total = 0
    for name in ("a", "b", "c"):
        config = load([], environ=compose_env(name))
        _serves_the_network_for_users(config)
        (secret,) = compose["services"][name]["secrets"]
        assert config.password_file == f"/run/secrets/{secret}", name
        assert any(p.split(":")[-1] == "1883" for p in compose["services"][name]["ports"]), name
        total += config.workers * config.replication_factor * config.retention_bytes
    source = compose["secrets"][secret]["file"]
    assert (DEPLOY / source).resolve().parent == DEPLOY / "secrets"
    assert "/deploy/secrets/" in (ROOT / ".gitignore").read_text().splitlines()  # users stay out of git
    # The three nodes' logs share one host's disk: the sum compose.yaml's comment states.
    assert total == 12 << 30


def test_the_statefulset_listens_for_the_users_of_a_secret_and_fits_its_volume():
    sts = statefulset()
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    config = load([], environ=k8s_env())
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    _serves_the_network_for_users(config, ports["mqtt"])
    assert container["livenessProbe"]["tcpSocket"]["port"] == "mqtt"  # reaches the pod's IP now
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volume = mounts[str(Path(config.password_file).parent)]
    secret = next(v for v in pod["volumes"] if v["name"] == volume)["secret"]
    assert secret["secretName"] == "brokerd-passwd" and secret["defaultMode"] & 0o040  # fsGroup 10001 reads it
    # Every router's log and a follower's copy of another's on the claim, with a fifth of it spare.
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    storage = _quantity(claim["spec"]["resources"]["requests"]["storage"])
    workers = int(container["resources"]["limits"]["cpu"])  # --workers follows limits.cpu
    assert config.replication_factor == 2
    assert workers * config.replication_factor * config.retention_bytes <= 0.8 * storage


def _quantity(value: str) -> int:
    """A Kubernetes binary quantity ("10Gi") in bytes."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    return int(value[:-2]) * units[value[-2:]] if value[-2:] in units else int(value)
