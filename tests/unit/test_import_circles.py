"""No import circle among brokerd's modules at run time, lazy imports included.

Why lazy ones count: an import inside a function still runs, only later; two modules that need
each other and hold together because one of them imports the other in a function are one module
in two files, and which of them may be imported first is left to chance. Imports for
annotations only (``if TYPE_CHECKING:``) never run and do not count.

Read from the sources (no module is imported): every ``import``/``from ... import`` anywhere in a
module, resolved to the brokerd module it loads (``from . import wire`` loads ``wire``; ``from
.config import Config`` loads ``config``; a package's name alone its ``__init__``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cluster", "router", "connection")


def _module_files() -> dict[str, Path]:
    """Every module of the packages, by its name (``brokerd.router.clock``; a package: its
    ``__init__.py``)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "__compiled__" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(("brokerd", *(parts[:-1] if parts[-1] == "__init__" else parts)))
            found[name] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The nodes under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).split(".")[-1] == "TYPE_CHECKING":
            for statement in node.body:
                skipped.update(id(n) for n in ast.walk(statement))
    return skipped


def imports_at_run_time(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The brokerd modules that module ``name`` loads when it runs, wherever the import is."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    loaded: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            loaded.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            source = ".".join(x for x in (base, node.module) if x)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                loaded.add(submodule if submodule in modules else source)
    return {m for m in loaded if m in modules and m != name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative):
    each is a set of modules that import each other, directly or not."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _module_files()
    return {name: imports_at_run_time(name, path, modules) for name, path in modules.items()}


def test_no_module_of_cluster_router_or_connection_is_in_an_import_circle() -> None:
    found = circles(_graph())
    assert found == [], "modules that import each other at run time (lazy imports included):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_the_finder_sees_a_circle_held_by_a_lazy_import_and_not_one_for_annotations_only(tmp_path) -> None:
    """The check itself: a function's import closes a circle; an ``if TYPE_CHECKING:`` one does not."""
    pkg = tmp_path / "router"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def later():\n    from .a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import y\n")
    (pkg / "d.py").write_text("from .c import z\n")
    modules = {f"brokerd.router.{p.stem}" if p.stem != "__init__" else "brokerd.router": p for p in pkg.glob("*.py")}
    graph = {name: imports_at_run_time(name, path, modules) for name, path in modules.items()}
    assert circles(graph) == [["brokerd.router.a", "brokerd.router.b"]]
