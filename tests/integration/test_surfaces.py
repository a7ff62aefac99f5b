"""The cluster's own surfaces are closed by default: a mesh off loopback needs a key (or the
operator's word), run directories are private and checked, and the data a broker keeps on disk
(segments, indexes, state.msgpack) is readable by its user alone."""

from __future__ import annotations

import os
import stat

import pytest

from brokerd.cluster.config import ConfigError, load
from brokerd.cluster.paths import private_dir
from tests.helpers import Client


def test_a_mesh_off_loopback_needs_a_key_or_the_operators_word():
    with pytest.raises(ConfigError, match="--mesh: 0.0.0.0:7000 is not a loopback address.*--mesh-key"):
        load(["--mesh", "0.0.0.0:7000", "--listen", "127.0.0.1:1883"], environ={})
    assert load(["--mesh", "0.0.0.0:7000", "--mesh-insecure", "on"], environ={}).mesh_insecure
    assert load(["--mesh", "0.0.0.0:7000", "--mesh-key", "k.key_secret"], environ={}).mesh_key
    assert load(["--mesh", "127.0.0.2:7000"], environ={}).mesh == ("127.0.0.2", 7000)  # loopback: as before


def test_run_directories_are_private_and_checked(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    private_dir(str(loose))
    assert stat.S_IMODE(os.lstat(loose).st_mode) == 0o700  # ours: tightened
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    with pytest.raises(PermissionError, match="not a directory"):
        private_dir(str(link))
    if os.getuid() == 0:  # only root can hand a directory to another user
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(PermissionError, match="belongs to uid 65534"):
            private_dir(str(theirs))


def test_what_a_broker_keeps_on_disk_is_its_users_alone(start_broker, tmp_path):
    broker = start_broker("--fsync", "always", data_dir=str(tmp_path / "data"))
    sub = Client(broker.port, "disk-sub", clean=False).connect()
    sub.subscribe("disk/#", 1)
    Client(broker.port, "disk-pub").connect().publish("disk/t", b"kept", qos=1)
    sub.wait_topic("disk/t")
    assert broker.stop() == 0  # writes state.msgpack
    router_dir = tmp_path / "data" / "t" / "w0"
    files = [p for p in router_dir.iterdir() if p.is_file()]
    assert any(p.suffix == ".log" for p in files) and (router_dir / "state.msgpack").exists(), files
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, f"{p.name} is {oct(p.stat().st_mode)}"
    for d in (tmp_path / "data" / "t", router_dir):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, f"{d} is {oct(d.stat().st_mode)}"
