"""The compiled hot path's switch: whether this process imports the compiled modules or the .py files.

``setup.py`` compiles the hot path (the codec and the topic index, and what they import) with mypyc
into a ``__compiled__`` folder beside each package's sources, with a manifest of what it built and
the SHA-256 of each source it built from. Python never finds a module there by itself, so the
pure-Python modules are what runs unless this switch, installed when ``brokerd.connection`` or
``brokerd.router`` is first imported, decides otherwise. It does, once per process, when:

* ``BROKERD_PURE`` is unset (or ``0``): ``BROKERD_PURE=1`` forces the pure modules;
* a manifest is there, built for this interpreter (the extension suffix matches);
* every source is the one compiled (same SHA-256): a checkout edited since its last build runs
  pure Python, with one warning, rather than yesterday's code. mypyc compiles the modules as one
  group whose calls between modules are direct, so the group is taken whole or not at all.

Then a meta-path finder serves each module of the manifest from its extension file. The choice
is made before any of those modules is imported, so a process never mixes the two.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

FOLDER = "__compiled__"
"""Beside a package's sources: its compiled modules (Python's own import never looks in it)."""

MANIFEST = "manifest.json"
"""In ``connection/__compiled__``: the compiler, the extension suffix and every compiled module."""

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # brokerd's folder (or the checkout's)


def forced_pure(environ: Mapping[str, str] = os.environ) -> bool:
    """``BROKERD_PURE`` set to anything but ``0``: the pure modules, whatever was compiled."""
    return environ.get("BROKERD_PURE", "") not in ("", "0")


class CompiledFinder:
    """Serves the manifest's modules from their extension files (a meta-path finder)."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files  # module name -> extension file

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, file)
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def _place(root: str, module: str, suffix: str) -> tuple[str, str]:
    """(extension file, source file) of ``brokerd.<package>.<name>`` under ``root``."""
    parts = module.split(".")[1:]
    folder = os.path.join(root, *parts[:-1])
    return os.path.join(folder, FOLDER, parts[-1] + suffix), os.path.join(folder, parts[-1] + ".py")


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def changed_source(root: str, modules: Mapping[str, str | None], suffix: str) -> str | None:
    """The first of the manifest's ``modules`` whose source under ``root`` is not the one compiled
    (missing, or another SHA-256), or None. ``scripts/lib/venv.sh`` asks this too, to rebuild."""
    for module, digest in modules.items():
        source = _place(root, module, suffix)[1]
        if digest is not None and (not os.path.exists(source) or _sha256(source) != digest):
            return module
    return None


def decide(root: str, pure: bool) -> tuple[CompiledFinder | None, str]:
    """The finder to install (None: pure Python) and the words that say what runs, for the
    packages under ``root`` (brokerd's folder); ``pure``: BROKERD_PURE is set."""
    if pure:
        return None, "pure Python (BROKERD_PURE is set)"
    try:
        with open(os.path.join(root, "connection", FOLDER, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        suffix, compiler, modules = manifest["suffix"], manifest["compiler"], dict(manifest["modules"])
    except FileNotFoundError:
        return None, "pure Python (not compiled)"
    except (OSError, ValueError, KeyError, TypeError) as exc:  # a broken build never stops a broker
        return None, f"pure Python (unreadable {MANIFEST}: {exc!r})"
    if suffix not in importlib.machinery.EXTENSION_SUFFIXES:
        return None, f"pure Python (compiled for another interpreter: {suffix})"
    files: dict[str, str] = {}
    for module in modules:
        file = _place(root, module, suffix)[0]
        if not os.path.exists(file):
            return None, f"pure Python (the compiled build lacks {os.path.basename(file)})"
        files[module] = file
    changed = changed_source(root, modules, suffix)
    if changed is not None:
        warnings.warn(f"brokerd: {changed} changed since it was compiled: running pure Python; "
                      "rebuild with `pip install -e .` (or set BROKERD_PURE=1 to silence this)",
                      RuntimeWarning, stacklevel=2)
        source = _place(root, changed, suffix)[1]
        return None, f"pure Python (the compiled build is older than {os.path.basename(source)})"
    return CompiledFinder(files), f"compiled ({compiler})"


def _install() -> tuple[bool, str]:
    finder, words = decide(_ROOT, forced_pure())
    if finder is None:
        return False, words
    early = sorted(set(finder.files) & set(sys.modules))
    if early:  # imported before this switch: the group is taken whole or not at all
        return False, f"pure Python ({early[0]} was imported before the switch)"
    sys.meta_path.insert(0, finder)
    return True, words


COMPILED, IMPLEMENTATION = _install()
"""Whether this process runs the compiled hot path, and that in words ("compiled (mypyc 1.x)",
"pure Python (BROKERD_PURE is set)" ...); the start-up line says "compiled" or "pure Python"."""


def implementation() -> str:
    """"compiled" or "pure Python": what this process runs."""
    return "compiled" if COMPILED else "pure Python"
