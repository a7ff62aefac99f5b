"""The deployments' own options, run for real and reached from another host: a network namespace the
test makes, joined to this one by a veth pair on a private /30. Docker is not available to the tests,
so brokerd runs here with the variables the Dockerfile, compose.yaml and the StatefulSet give it (parsed
from those files: a file that regresses to loopback, or to no users, fails here). A client in the
namespace logs in as the password file's user; an anonymous one is refused."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.deploy.test_files import DEPLOYMENTS
from tests.helpers import BROKERD, WAIT, Broker, free_port

CMD_S = WAIT + 5  # bound of one ip / mosquitto_* / brokerd health command (mosquitto_sub -W WAIT inside)
USER, PASSWORD = "operator", "s3cret-for-the-test"


@dataclass(frozen=True)
class Namespace:
    name: str
    host_address: str  # this side of the veth pair: where the namespace reaches brokerd

    def run(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.name, *argv], capture_output=True, text=True,
                              timeout=CMD_S)


def _ip(*argv: str) -> None:
    out = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=CMD_S)
    assert out.returncode == 0, f"ip {' '.join(argv)}: {out.stderr}"


@pytest.fixture
def netns() -> Iterator[Namespace]:
    """A namespace of this test's own, with a veth pair to it: 10.200.X.(4k+1) here, +2 there."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a network namespace")
    if shutil.which("ip") is None or shutil.which("mosquitto_pub") is None:
        pytest.skip("needs the ip command (iproute2) and mosquitto_pub/mosquitto_sub")
    tag = f"{os.getpid() % 100000}{random.randrange(100)}"
    name, here, there = f"brokerd-t{tag}", f"bkh{tag}", f"bkn{tag}"
    base = f"10.200.{random.randrange(256)}.{4 * random.randrange(64)}"
    prefix, last = base.rsplit(".", 1)
    host_address, ns_address = f"{prefix}.{int(last) + 1}", f"{prefix}.{int(last) + 2}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=CMD_S)
    if made.returncode != 0:
        pytest.skip(f"ip netns is not available here: {made.stderr.strip()}")
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", name)
        _ip("addr", "add", f"{host_address}/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("-n", name, "addr", "add", f"{ns_address}/30", "dev", there)
        _ip("-n", name, "link", "set", there, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        yield Namespace(name, host_address)
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=CMD_S)  # its peer goes too
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=CMD_S)


@pytest.mark.parametrize("deployment", sorted(DEPLOYMENTS))
def test_a_deployment_serves_its_users_on_a_non_loopback_address_and_refuses_anonymous(
        deployment, netns, xprocess, tmp_path):
    env = DEPLOYMENTS[deployment]()
    # What the file says, changed only where this host needs it: a free port for 1883 and the metrics,
    # the data and the password file under tmp_path; the mesh is another test's (it needs peers).
    listen = env["BROKERD_LISTEN"]
    assert listen == "mqtt://0.0.0.0:1883", listen
    port = free_port("0.0.0.0")
    passwd = tmp_path / "passwd"
    made = subprocess.run([BROKERD, "passwd", str(passwd), USER], input=PASSWORD + "\n", capture_output=True,
                          text=True, timeout=CMD_S)
    assert made.returncode == 0, made.stderr
    env.update(BROKERD_LISTEN=listen.replace(":1883", f":{port}"), BROKERD_PASSWORD_FILE=str(passwd),
               BROKERD_DATA_DIR=str(tmp_path / "data"), BROKERD_METRICS_PORT=str(free_port("0.0.0.0")),
               BROKERD_NODE_ID=deployment)
    # One node of the deployment: its cluster options (the other nodes' names, which resolve only
    # there) go, agreement's with the mesh's (tests/deploy/test_files.py checks them).
    for var in ("BROKERD_MESH", "BROKERD_PEER", "BROKERD_MESH_KEY", "BROKERD_AGREEMENT", "BROKERD_AGREEMENT_PEER"):
        env.pop(var, None)
    inherited = {k: "" for k in os.environ if k.startswith("BROKERD_")}  # empty: unset, to brokerd
    broker = Broker(xprocess, f"brokerd-reach-{deployment}-{port}", [], "0.0.0.0", port, env={**inherited, **env})
    broker.start()
    try:
        host = ["-h", netns.host_address, "-p", str(port)]
        sent = netns.run("mosquitto_pub", *host, "-u", USER, "-P", PASSWORD, "-t", "deploy/reach", "-m", deployment,
                         "-r", "-q", "1")
        assert sent.returncode == 0, sent.stderr
        got = netns.run("mosquitto_sub", *host, "-u", USER, "-P", PASSWORD, "-t", "deploy/reach", "-C", "1",
                        "-W", str(int(WAIT)))
        assert got.returncode == 0 and got.stdout.strip() == deployment, got.stderr
        anonymous = netns.run("mosquitto_sub", *host, "-t", "deploy/reach", "-C", "1", "-W", str(int(WAIT)))
        assert anonymous.returncode != 0 and "not authori" in anonymous.stderr.lower(), anonymous.stderr
        wrong = netns.run("mosquitto_sub", *host, "-u", USER, "-P", "guess", "-t", "deploy/reach", "-C", "1",
                          "-W", str(int(WAIT)))
        assert wrong.returncode != 0, wrong.stderr
        # The deployment's health check, with its options, sees the node it serves.
        health = subprocess.run([BROKERD, "health", "--timeout", "3"], env={**os.environ, **inherited, **env},
                                capture_output=True, text=True, timeout=CMD_S)
        assert health.returncode == 0, health.stderr
    finally:
        xprocess.getinfo(broker.name).terminate(timeout=15)
