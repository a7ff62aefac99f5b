"""The agreement options: what --agreement needs, and what it refuses with one line naming the option."""

from __future__ import annotations

import pytest

from brokerd.cluster.config import ConfigError, load

MESH = ["--mesh", "127.0.0.1:7100", "--mesh-key", "k.key_secret"]


def test_agreement_with_its_peers_and_timeout():
    cfg = load([*MESH, "--agreement", "127.0.0.1:7300", "--agreement-peer", "127.0.0.2:7300",
                "--agreement-peer", "127.0.0.3:7300", "--agreement-timeout", "2.5"], {})
    assert cfg.agreement == ("127.0.0.1", 7300)
    assert cfg.agreement_peer == (("127.0.0.2", 7300), ("127.0.0.3", 7300))
    assert cfg.agreement_timeout == 2.5


def test_a_mesh_needs_agreement_or_off_said_in_so_many_words():
    """A node of a cluster runs on agreement, or on the lease rules (which a partition can make
    lose acknowledged messages) only when its operator says ``off``: never by omission."""
    with pytest.raises(ConfigError) as refused:
        load(MESH, {})
    said = str(refused.value)
    assert said.startswith("--mesh: 127.0.0.1:7100 needs --agreement HOST:PORT") and "--agreement off" in said
    for off in ([*MESH, "--agreement", "off"], [*MESH, "--agreement", "OFF"]):
        cfg = load(off, {})
        assert cfg.agreement is None and cfg.agreement_off and cfg.agreement_peer == ()
    assert load(MESH, {"BROKERD_AGREEMENT": "off"}).agreement_off
    insecure = load(["--mesh", "127.0.0.1:7100", "--mesh-insecure", "on", "--agreement", "off"], {})
    assert insecure.agreement is None and insecure.agreement_off
    assert not load([], {}).agreement_off  # a node alone needs neither


def test_agreement_alone_is_a_cluster_of_one():
    cfg = load([*MESH, "--agreement", "127.0.0.1:7300"], {})
    assert cfg.agreement == ("127.0.0.1", 7300) and cfg.agreement_peer == () and cfg.agreement_timeout == 5.0
    assert not cfg.agreement_off


def test_agreement_off_from_a_toml_file(tmp_path):
    conf = tmp_path / "brokerd.toml"
    conf.write_text('mesh = "127.0.0.1:7100"\nmesh_key = "k.key_secret"\nagreement = "off"\n')
    assert load(["--config", str(conf)], {}).agreement_off


def test_agreement_peers_from_the_environment():
    cfg = load(MESH, {"BROKERD_AGREEMENT": "127.0.0.1:7300", "BROKERD_AGREEMENT_PEER": "b:7300, c:7300"})
    assert cfg.agreement_peer == (("b", 7300), ("c", 7300))


def test_one_list_of_members_serves_every_node():
    """A StatefulSet or a compose anchor gives every node the same list: its own address in it is
    left out (before, refused), and one named twice counts once."""
    members = "a:7300,b:7300,c:7300,b:7300"
    for me in ("a", "b", "c"):
        cfg = load(MESH, {"BROKERD_AGREEMENT": f"{me}:7300", "BROKERD_AGREEMENT_PEER": members})
        assert cfg.agreement_peer == tuple((n, 7300) for n in "abc" if n != me)


@pytest.mark.parametrize("argv, says", [
    (["--mesh", "127.0.0.1:7100", "--mesh-insecure", "on", "--agreement", "127.0.0.1:7300"],
     "--agreement: 127.0.0.1:7300 needs --mesh and --mesh-key FILE"),
    (["--agreement", "127.0.0.1:7300"], "--agreement: 127.0.0.1:7300 needs --mesh and --mesh-key FILE"),
    ([*MESH, "--agreement-peer", "127.0.0.2:7300"], "--agreement-peer: needs --agreement HOST:PORT"),
    ([*MESH, "--agreement", "off", "--agreement-peer", "127.0.0.2:7300"],
     "--agreement-peer: needs --agreement HOST:PORT"),
    ([*MESH, "--agreement", "of"], "--agreement: invalid value 'of'"),
    ([*MESH, "--agreement", "0.0.0.0:7300"], "--agreement: 0.0.0.0:7300 is no address another node can reach"),
    ([*MESH, "--agreement", "127.0.0.1:7100"], "--agreement: port 7100 is also used by --mesh"),
    ([*MESH, "--agreement", "127.0.0.1:0"], "--agreement: must be a port number"),
    ([*MESH, "--agreement", "127.0.0.1:7300", "--agreement-timeout", "0"], "--agreement-timeout: must be positive"),
])
def test_what_agreement_refuses(argv, says):
    with pytest.raises(ConfigError) as refused:
        load(argv, {})
    assert says in str(refused.value)
