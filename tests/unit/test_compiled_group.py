"""What setup.py compiles (``hot_path``) and what mypy only reads for its types (``typed_with``).

mypyc compiles the modules the roots import at run time, as one group; a module named only in an
annotation (``if TYPE_CHECKING:``) or a package's ``__init__`` is read for its types and stays
Python. Tested on a laid-out tree of small modules (setup.py's functions, its ``setup()`` not run).
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import setuptools

from tests.helpers import ROOT

FILES = {
    "router/a.py": "from typing import TYPE_CHECKING\nfrom .b import f\nfrom .log import W\n"
                   "if TYPE_CHECKING:\n    from .c import C\n",
    "router/b.py": "def f():\n    from .d import g  # a function's import runs too\n",
    "router/c.py": "from .e import E\n",
    "router/d.py": "g = 1\n",
    "router/e.py": "E = 1\n",
    "router/log/__init__.py": "from .w import W\n",
    "router/log/w.py": "W = 1\n",
}


@pytest.fixture
def setup_py(tmp_path, monkeypatch):
    """setup.py's namespace, its modules looked up under ``tmp_path``, the root ``router.a``."""
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(setuptools, "setup", lambda **kw: None)
    ns = runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test")
    ns["hot_path"].__globals__["HERE"] = str(tmp_path)
    ns["HOT_PATH_ROOTS"][:] = ["brokerd.router.a"]
    return ns


def test_the_group_is_what_the_roots_import_at_run_time(setup_py):
    assert setup_py["hot_path"]() == ["brokerd.router.a", "brokerd.router.b", "brokerd.router.d"]


def test_annotations_and_packages_are_read_for_their_types_not_compiled(setup_py):
    assert setup_py["typed_with"]() == [
        "brokerd.router.a", "brokerd.router.b", "brokerd.router.c", "brokerd.router.d", "brokerd.router.e",
        "brokerd.router.log", "brokerd.router.log.w",
    ]


def test_the_shipped_group_holds_the_codec_the_topic_index_and_the_log_writer(monkeypatch):
    monkeypatch.setattr(setuptools, "setup", lambda **kw: None)
    group = runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test")["hot_path"]()
    assert {"brokerd.connection.decode", "brokerd.router.topics", "brokerd.router.log.writer"} <= set(group)
    assert "brokerd.router.log" not in group  # a package's __init__: Python
    assert all(Path(ROOT, *m.split(".")[1:]).with_suffix(".py").is_file() for m in group)


def _shipped_group(monkeypatch, router_path: str | None) -> set[str]:
    monkeypatch.setattr(setuptools, "setup", lambda **kw: None)
    if router_path is None:
        monkeypatch.delenv("BROKERD_ROUTER_PATH", raising=False)
    else:
        monkeypatch.setenv("BROKERD_ROUTER_PATH", router_path)
    return set(runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test")["hot_path"]())


def test_the_shipped_group_holds_the_routers_per_message_path(monkeypatch):
    group = _shipped_group(monkeypatch, None)
    assert {"brokerd.connection.protocol", "brokerd.router.client", "brokerd.router.router",
            "brokerd.router.session", "brokerd.router.message", "brokerd.router.acks"} <= group


def test_router_path_0_builds_the_small_group_only(monkeypatch):
    small = _shipped_group(monkeypatch, "0")
    assert {"brokerd.connection.decode", "brokerd.router.topics", "brokerd.router.log.writer"} <= small
    assert not {"brokerd.connection.protocol", "brokerd.router.client", "brokerd.router.router"} & small
    assert small < _shipped_group(monkeypatch, None)
