"""The mesh's part of the compiled group (setup.py's ``hot_path``): the takeover's path, and
nothing the mesh's Python needs to stay Python.

A CONNECT with two workers runs the takeover (``takeover``, ``transfer``, ``waiter``) from
compiled ``router.connecting``, so they are compiled with it. The ``Mesh`` itself stays Python:
it is made of mixins (``framing``, ``dispatch``, ``forwarding``), and a Python class cannot
inherit from compiled ones; an import that pulled a mixin in would leave every worker failing
at start. Configuration, agreement and replication stay out too: they are not on a message's or
a connect's path, and compiled, every annotation on what they read from the network or disk
would be checked at run time.
"""

from __future__ import annotations

import runpy

import pytest
import setuptools

from tests.helpers import ROOT


@pytest.fixture
def group(monkeypatch) -> set[str]:
    monkeypatch.setattr(setuptools, "setup", lambda **kw: None)
    monkeypatch.delenv("BROKERD_ROUTER_PATH", raising=False)
    return set(runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test")["hot_path"]())


def test_the_takeover_path_is_compiled_with_the_router(group):
    assert {"brokerd.cluster.mesh.takeover", "brokerd.cluster.mesh.transfer",
            "brokerd.cluster.mesh.waiter", "brokerd.router.connecting"} <= group


def test_the_mesh_s_mixins_stay_python(group):
    assert not {"brokerd.cluster.mesh.framing", "brokerd.cluster.mesh.dispatch",
                "brokerd.cluster.mesh.forwarding", "brokerd.cluster.mesh"} & group


def test_configuration_agreement_and_replication_stay_out(group):
    assert not [m for m in group if m == "brokerd.cluster.config" or m.startswith(
        ("brokerd.cluster.agreement", "brokerd.cluster.replication", "brokerd.cluster.quorum"))]
