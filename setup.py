"""The compiled hot path's build; pyproject.toml holds everything else about the package.

mypyc compiles the hot path (``hot_path()``: the codec, the topic index, the log's writer and the
router's per-message path, plain typed Python that stays the reference and runs wherever nothing
was compiled) into a ``__compiled__`` folder beside each package's sources, and
writes ``connection/__compiled__/manifest.json``: the compiler, the extension suffix and the
SHA-256 of every source compiled. ``connection/_compiled.py`` reads it and decides, per process,
which of the two runs. Why mypyc and not Cython: docs/benchmarks.md, "Compiled hot path: the choice".

``pip install .`` builds them into the wheel, ``pip install -e .`` beside the sources. The install
never fails for want of them: without mypy, without a working C compiler, or with a module mypyc
refuses, it goes on with pure Python and says so once. ``BROKERD_PURE=1`` skips the compiling;
``BROKERD_ROUTER_PATH=0`` compiles the small group only (``ROUTER_PATH_ROOTS`` says what for).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import traceback

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CORE_ROOTS = [
    "brokerd.connection.decode", "brokerd.connection.encode",  # the codec
    "brokerd.router.topics",  # the topic index
    "brokerd.router.log.writer",  # the log's batches written: encoding, pwritev, the index, fsync
]
"""The codec, the topic index and the commit log's writer: the small group, compiled alone with
``BROKERD_ROUTER_PATH=0``."""

ROUTER_PATH_ROOTS = ["brokerd.connection.protocol", "brokerd.router.client", "brokerd.router.router"]
"""The per-message path from the connection to the session (53 modules with the core's: 1.3-1.6x
messages per CPU-second, docs/benchmarks.md, "Compiled router path"). It gains only whole: a
line between compiled and Python code on that path costs more than the compiled side saves.

Compiled, every declared type is checked at run time: an annotation that is not true of what
flows in (from msgpack, the mesh, a log record, the standard library where typeshed is wrong)
raises TypeError, and a mesh frame that meets one is dropped. ``BROKERD_ROUTER_PATH=0`` at build
time leaves it Python: to tell such a TypeError from a bug of the code (the same traffic, with
the path Python), or to build in a quarter of the compiler's time (docs/benchmarks.md)."""

HOT_PATH_ROOTS = CORE_ROOTS if os.environ.get("BROKERD_ROUTER_PATH", "") == "0" else CORE_ROOTS + ROUTER_PATH_ROOTS
"""What is compiled is these and every brokerd module they import at run time (``hot_path``):
mypyc compiles them as one closed group, and a module moved or split stays in it. What they
import for annotations only (``if TYPE_CHECKING:``), and the packages' ``__init__`` (names
re-exported), mypy reads for their types; they stay Python (``typed_with``)."""

GROUP = "brokerd.connection._hot"
"""mypyc's group: its shared library is ``brokerd.connection._hot__mypyc``."""

FOLDER = "__compiled__"  # as connection/_compiled.py's FOLDER
HERE = os.path.dirname(os.path.abspath(__file__))


def _source(module: str) -> str:
    """``brokerd.<package>...<name>``'s file: the packages are top-level folders (pyproject.toml);
    a package's is its ``__init__.py``."""
    path = os.path.join(HERE, *module.split(".")[1:])
    return os.path.join(path, "__init__.py") if os.path.isdir(path) else path + ".py"


def _package(module: str) -> bool:
    return _source(module).endswith("__init__.py")


def _annotations_only(tree: ast.Module) -> set[int]:
    """The nodes under ``if TYPE_CHECKING:``: imports that never run."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            inside.update(id(n) for statement in node.body for n in ast.walk(statement))
    return inside


def _imported(module: str, annotations: bool = False) -> set[str]:
    """The brokerd modules ``module`` imports, wherever in it (a function's import counts too);
    with ``annotations``, those it imports for its annotations only (``if TYPE_CHECKING:``) too."""
    with open(_source(module), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    skipped = set() if annotations else _annotations_only(tree)
    here = module if _package(module) else module.rsplit(".", 1)[0]  # what ``from .`` names
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here.rsplit(".", node.level - 1)[0] if node.level else ""
            name = ".".join(x for x in (base, node.module) if x)
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)  # ``from . import wire``
    return {m for m in found if m.startswith("brokerd.") and os.path.isfile(_source(m))}


def _closure(roots: list[str], annotations: bool) -> list[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(m for m in _imported(module, annotations) if annotations or not _package(m))
    return sorted(seen)


def hot_path() -> list[str]:
    """``HOT_PATH_ROOTS`` and every brokerd module they import at run time, directly or not."""
    return _closure(HOT_PATH_ROOTS, annotations=False)


def typed_with() -> list[str]:
    """The modules mypy reads to type the hot path: ``hot_path()`` and what any of them names in
    an annotation. Those outside ``hot_path()`` are read, not compiled: the compiled code holds
    their objects as Python objects, and they run as Python beside it."""
    return _closure(HOT_PATH_ROOTS, annotations=True)


_warned: list[str] = []


def _warn(why: str) -> None:
    """Once per build, however many times setuptools makes its build_ext."""
    if _warned:
        return
    _warned.append(why)
    print(f"\nWARNING: brokerd's hot path is not compiled ({why}); installing pure Python, "
          "which runs the same, slower.\n", file=sys.stderr, flush=True)


def _mypycify(build_temp: str) -> list[Extension]:
    """mypyc's extensions for the hot path, from copies laid out as ``brokerd/<package>/``, for
    mypyc names a module after its folders and the sources live in folders named otherwise."""
    from mypyc.build import mypycify

    staged = os.path.join(build_temp, "mypyc-src")
    shutil.rmtree(staged, ignore_errors=True)
    compiled = set(hot_path())
    paths = []
    for module in typed_with():  # a package's __init__ too: what it exports types its importers
        target = os.path.join(staged, *module.split("."), "__init__.py") if _package(module) \
            else os.path.join(staged, *module.split(".")) + ".py"
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(os.path.join(os.path.dirname(target), "__init__.py"), "a").close()  # empty: not compiled
        shutil.copyfile(_source(module), target)
        if module in compiled:
            paths.append(os.path.relpath(target))
    before = os.environ.get("MYPYPATH")
    os.environ["MYPYPATH"] = os.path.relpath(staged)  # module names from brokerd/ down
    # No config file: the project's mypy settings are for checking, not for this build; msgpack
    # and the like have no types: the compiled code calls them as Python does.
    try:
        return mypycify(["--config-file=", "--explicit-package-bases", "--ignore-missing-imports",
                         f"--cache-dir={os.path.join(build_temp, 'mypy-cache')}", *paths],
                        group_name=GROUP, target_dir=os.path.join(build_temp, "mypyc"))
    finally:
        if before is None:
            del os.environ["MYPYPATH"]
        else:
            os.environ["MYPYPATH"] = before


BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "install", "develop", "bdist"}
"""Commands that compile; the others (dist_info, egg_info, sdist) only ask build_ext what it has."""

_made: list[Extension] = []


class BuildHotPath(build_ext):
    """Compiles the hot path into ``__compiled__`` folders, or warns and builds nothing."""

    def finalize_options(self) -> None:
        extensions = self._hot_path()
        if extensions:
            self.distribution.ext_modules = extensions
        super().finalize_options()
        if not extensions:  # the placeholder stays the distribution's: one wheel layout either way
            self.extensions = []

    def _hot_path(self) -> list[Extension]:
        """mypyc's extensions, or none (and a warning that says why)."""
        if not BUILDS & set(self.distribution.commands):
            return []  # metadata or an sdist: what build_ext would build is not asked for
        if os.environ.get("BROKERD_PURE", "") not in ("", "0"):
            _warn("BROKERD_PURE is set")
            return []
        if _made:  # setuptools makes more than one build_ext in a build: mypyc runs once
            return _made
        try:
            _made.extend(_mypycify(self.build_temp or os.path.join("build", "temp-hot-path")))
            return _made
        except ImportError:
            _warn("mypy is not installed: pip install mypy")
        except SystemExit:  # mypyc refuses a module by exiting, its errors printed
            _warn("mypyc refused a module, see its errors above")
        except Exception:
            traceback.print_exc()
            _warn("mypyc failed, see above")
        return []

    def get_ext_filename(self, fullname: str) -> str:
        head, tail = os.path.split(super().get_ext_filename(fullname))
        return os.path.join(head, FOLDER, tail)

    def run(self) -> None:
        manifests = [os.path.join(self.build_lib, "brokerd", "connection", FOLDER, "manifest.json")]
        if self.inplace or self.editable_mode:
            manifests.append(os.path.join(HERE, "connection", FOLDER, "manifest.json"))
        for stale in manifests:  # a failed build leaves no manifest: pure Python, not an old build
            if os.path.exists(stale):
                os.remove(stale)
        if not self.extensions:
            return
        try:
            super().run()
        except Exception as exc:  # no C compiler, or it failed: the package installs all the same
            print(exc, file=sys.stderr)
            _warn(f"the C compiler failed: {type(exc).__name__}, above")
            return
        manifest = {
            "compiler": f"mypyc {_mypy_version()}",
            "suffix": sysconfig.get_config_var("EXT_SUFFIX"),
            "modules": {GROUP + "__mypyc": None} | {m: _sha256(_source(m)) for m in hot_path()},
        }
        for path in manifests:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=1, sort_keys=True)

    def copy_extensions_to_source(self) -> None:
        """``--inplace`` and editable installs: into the sources' ``__compiled__`` folders."""
        for ext in self.extensions:
            fullname = self.get_ext_fullname(ext.name)
            built = os.path.join(self.build_lib, self.get_ext_filename(fullname))
            folder = os.path.join(HERE, *fullname.split(".")[1:-1])
            target = os.path.join(folder, FOLDER, os.path.basename(built))
            self.mkpath(os.path.dirname(target))
            # A new file put in the old one's place: a broker running the old one keeps its copy
            # (writing over a loaded extension in place would crash it).
            self.copy_file(built, target + ".new", level=self.verbose)
            os.replace(target + ".new", target)

    def get_output_mapping(self) -> dict[str, str]:
        return {}  # editable installs: the sources' folders already hold the extensions


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _mypy_version() -> str:
    from mypy.version import __version__
    return __version__


# A placeholder until build_ext runs mypyc: it makes the wheel a platform wheel and runs build_ext.
setup(ext_modules=[Extension(GROUP + "__mypyc", sources=[])], cmdclass={"build_ext": BuildHotPath})
