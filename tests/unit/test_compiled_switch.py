"""The compiled hot path's switch (connection/_compiled.py): which implementation a process runs.

The rules are tested on a laid-out folder (empty files stand for the extensions: nothing is loaded
from them); what a real process imports is tested in subprocesses, with and without BROKERD_PURE.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from brokerd.connection import _compiled
from brokerd.connection._compiled import CompiledFinder, decide, forced_pure
from tests.helpers import ROOT

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
SHIM = ROOT / "scripts" / "lib" / "pythonpath"


def _lay_out(root: Path, sources: dict[str, bytes], suffix: str = SUFFIX) -> None:
    """A compiled build under ``root``: sources, a placeholder extension each, and the manifest."""
    modules: dict[str, str | None] = {"brokerd.connection._hot__mypyc": None}
    for module, text in sources.items():
        package, name = module.split(".")[1:]
        (root / package / "__compiled__").mkdir(parents=True, exist_ok=True)
        (root / package / f"{name}.py").write_bytes(text)
        (root / package / "__compiled__" / f"{name}{suffix}").write_bytes(b"")
        modules[module] = hashlib.sha256(text).hexdigest()
    (root / "connection" / "__compiled__" / f"_hot__mypyc{suffix}").write_bytes(b"")
    manifest = {"compiler": "mypyc 9.9", "suffix": suffix, "modules": modules}
    (root / "connection" / "__compiled__" / "manifest.json").write_text(json.dumps(manifest))


SOURCES = {"brokerd.connection.decode": b"x = 1\n", "brokerd.router.topics": b"y = 2\n"}


def test_a_fresh_build_is_served_from_its_compiled_folders(tmp_path):
    _lay_out(tmp_path, SOURCES)
    finder, words = decide(str(tmp_path), pure=False)
    assert words == "compiled (mypyc 9.9)"
    assert isinstance(finder, CompiledFinder)
    spec = finder.find_spec("brokerd.router.topics", None)
    assert spec is not None and spec.origin == str(tmp_path / "router" / "__compiled__" / f"topics{SUFFIX}")
    assert isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)
    assert finder.find_spec("brokerd.connection._hot__mypyc", None) is not None
    assert finder.find_spec("brokerd.connection.protocol", None) is None  # not compiled: Python's own import


def test_brokerd_pure_wins_over_a_fresh_build(tmp_path):
    _lay_out(tmp_path, SOURCES)
    assert decide(str(tmp_path), pure=True) == (None, "pure Python (BROKERD_PURE is set)")


@pytest.mark.parametrize(("value", "pure"), [("1", True), ("yes", True), ("0", False), ("", False), (None, False)])
def test_brokerd_pure_is_any_value_but_0(value, pure):
    assert forced_pure({} if value is None else {"BROKERD_PURE": value}) is pure


def test_no_build_runs_pure_python(tmp_path):
    assert decide(str(tmp_path), pure=False) == (None, "pure Python (not compiled)")


def test_a_source_edited_since_the_build_runs_pure_python_with_one_warning(tmp_path):
    _lay_out(tmp_path, SOURCES)
    (tmp_path / "router" / "topics.py").write_bytes(b"y = 3\n")
    with pytest.warns(RuntimeWarning, match="brokerd.router.topics changed since it was compiled"):
        finder, words = decide(str(tmp_path), pure=False)
    assert finder is None and words == "pure Python (the compiled build is older than topics.py)"


def test_a_build_for_another_interpreter_or_with_a_file_missing_runs_pure_python(tmp_path):
    _lay_out(tmp_path / "other", SOURCES, suffix=".cpython-399-x86_64-linux-gnu.so")
    finder, words = decide(str(tmp_path / "other"), pure=False)
    assert finder is None and words.startswith("pure Python (compiled for another interpreter")
    _lay_out(tmp_path / "lacking", SOURCES)
    (tmp_path / "lacking" / "router" / "__compiled__" / f"topics{SUFFIX}").unlink()
    assert decide(str(tmp_path / "lacking"), pure=False) == (None, f"pure Python (the compiled build lacks topics{SUFFIX})")


def test_a_broken_manifest_runs_pure_python(tmp_path):
    (tmp_path / "connection" / "__compiled__").mkdir(parents=True)
    (tmp_path / "connection" / "__compiled__" / "manifest.json").write_text("{not json")
    finder, words = decide(str(tmp_path), pure=False)
    assert finder is None and words.startswith("pure Python (unreadable manifest.json")


# What a real process imports. PYTHONPATH: this checkout's brokerd, as the tests and scripts/run use.

PROBE = """
import sys
{first}
import brokerd.connection.decode as d, brokerd.router.topics as t, brokerd.connection._compiled as c
print(c.COMPILED, c.IMPLEMENTATION, d.__file__, t.__file__, sep="\\n")
"""


def _probe(pure: str | None, first: str = "import brokerd.connection._compiled") -> tuple[bool, str, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "BROKERD_PURE"}
    env["PYTHONPATH"] = str(SHIM)
    if pure is not None:
        env["BROKERD_PURE"] = pure
    out = subprocess.run([sys.executable, "-c", PROBE.format(first=first)], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=60).stdout.splitlines()
    return out[0] == "True", out[1], out[2], out[3]


def _built() -> bool:
    """A build of this checkout that is current (what the switch would take)."""
    finder, _ = decide(str(SHIM / "brokerd"), pure=False)
    return finder is not None


def test_brokerd_pure_1_imports_the_py_files():
    compiled, words, decode, topics = _probe("1")
    assert not compiled and words == "pure Python (BROKERD_PURE is set)"
    assert decode.endswith(os.path.join("connection", "decode.py"))
    assert topics.endswith(os.path.join("router", "topics.py"))


def test_without_brokerd_pure_a_current_build_is_what_runs():
    compiled, words, decode, topics = _probe(None)
    assert compiled is _built(), words
    folder = "__compiled__" if compiled else ""
    assert os.path.dirname(decode).endswith(os.path.join("connection", folder).rstrip(os.sep))
    assert os.path.dirname(topics).endswith(os.path.join("router", folder).rstrip(os.sep))
    assert words.startswith("compiled (mypyc" if compiled else "pure Python")


def _wired() -> bool:
    return "_compiled" in (ROOT / "connection" / "__init__.py").read_text()


@pytest.mark.skipif(not _wired(), reason="connection/__init__.py and router/__init__.py do not import the "
                    "switch yet: until they do, the hot path runs pure Python everywhere")
@pytest.mark.parametrize("first", ["import brokerd.connection.codec", "import brokerd.router.topics"])
def test_importing_either_package_first_installs_the_switch(first):
    compiled, _, decode, _ = _probe(None, first=first)
    assert compiled is _built() and decode.endswith(".py") is not compiled


def test_this_process_runs_what_the_switch_says():
    import brokerd.connection.decode as decode
    assert decode.__file__.endswith(".py") is not _compiled.COMPILED
    assert _compiled.implementation() == ("compiled" if _compiled.COMPILED else "pure Python")


PARITY = """
import brokerd.connection._compiled
from brokerd.connection.codec import Decoder, encode, publish_parts
from brokerd.connection.packets import Connect, Prop, Puback, Publish, Subscribe, Subscription, Will
from brokerd.router.topics import TopicIndex
packets = [Connect("c", protocol_level=5, username="u", password=b"p", will=Will("w", b"x", 1, True)),
           Publish("a/b", b"x" * 300, qos=1, packet_id=9, properties={Prop.CONTENT_TYPE: "t"}),
           Publish("a/b", b"", qos=0), Puback(9, 0x10), Subscribe(3, [Subscription("a/+", 1)])]
out = []
for level in (4, 5):
    for p in packets[1:]:
        data = encode(p, level)
        out.append(data.hex() + " " + repr(Decoder(protocol_level=level).feed(data)))
out.append(repr(Decoder().feed(encode(packets[0], 5))))
out.append(repr(publish_parts(b"a/b", b"x", 1, False, 5)))
for bad in (b"\\x30\\x05\\x00\\x09a/b", b"\\x62\\x02\\x00\\x00", b"\\x10\\x00"):
    try:
        Decoder(protocol_level=5).feed(bad)
    except Exception as exc:
        out.append(repr((type(exc).__name__, str(exc), getattr(exc, "packets", None))))
index = TopicIndex()
for i, f in enumerate(["a/+", "a/#", "+/b", "a/b", "$SYS/#", "#"]):
    index.add(f, i, f)
out.append(repr([sorted(index.match(t)) for t in ("a/b", "a", "$SYS/x", "c/b/d")]))
print(brokerd.connection._compiled.COMPILED)
print("\\n".join(out))
"""


def test_compiled_and_pure_give_the_same_bytes_packets_errors_and_matches():
    """Meaningful where a build is current (CI, a built checkout); two pure runs agree anyway."""
    runs = {}
    for pure in ("1", "0"):
        env = {**os.environ, "PYTHONPATH": str(SHIM), "BROKERD_PURE": pure}
        out = subprocess.run([sys.executable, "-c", PARITY], env=env, cwd=ROOT, check=True,
                             capture_output=True, text=True, timeout=60).stdout.splitlines()
        runs[pure] = out
    assert runs["1"][0] == "False" and runs["0"][0] == str(_built() and _wired())
    assert runs["1"][1:] == runs["0"][1:]
    assert len(runs["1"]) == 15 and sum("ProtocolError" in line for line in runs["1"]) == 3
