"""The package's layout rules (issue 12): no import cycle between modules (issue 22: nor between
top-level packages), no module importing another module's private (``_name``) names.
``lint-imports`` (pyproject ``[tool.importlinter]``) checks cycles inside each package and the
layers; this checks the whole module graph, across packages too, and the package graph.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp

PKG = Path(__file__).resolve().parent.parent / "chaoslib_infer"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules() -> None:
    """Imports inside functions count (they only hide a cycle); ``TYPE_CHECKING`` ones do not."""
    graph = grimp.build_graph("chaoslib_infer", exclude_type_checking_imports=True)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _cycles(edges) == []


def _packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph of ``chaoslib_infer``'s top-level packages and modules (``a.b.c`` -> ``a.b``)."""

    def top(module: str) -> str:
        return ".".join(module.split(".")[:2])

    out: dict[str, set[str]] = {}
    for a, bs in edges.items():
        out.setdefault(top(a), set()).update(top(b) for b in bs if top(b) != top(a))
    return out


def test_the_package_graph_folds_modules_into_their_package() -> None:
    edges = {"p.a.x": {"p.b.y", "p.a.z"}, "p.b.y": {"p.a"}, "p.c": set()}
    assert _packages(edges) == {"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": set()}
    assert _cycles(_packages(edges)) == [["p.a", "p.b"]]


def test_no_import_cycle_between_packages() -> None:
    """Issue 22: no two top-level packages import each other, even through others or lazily
    (``lint-imports`` checks the layers themselves: pyproject ``[tool.importlinter]``)."""
    graph = grimp.build_graph("chaoslib_infer", exclude_type_checking_imports=True)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _cycles(_packages(edges)) == []


def _module_name(path: Path, root: Path = PKG) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_another_modules_private_names() -> None:
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    found = []
    for name, path in sorted(modules.items()):
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("chaoslib_infer") or source == name:
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and f"{source}.{alias.name}" not in modules:
                    found.append(f"{name} imports {source}.{alias.name}")
    assert found == []


def _resolve(package: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` reads from (``package``: the importer's)."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _module_aliases(tree: ast.AST, package: str, modules: dict[str, Path]) -> dict[str, str]:
    """Local names bound to a package module anywhere in ``tree``: ``import chaoslib_infer.x as
    m`` (``m``), ``import chaoslib_infer.x`` (``chaoslib_infer``), ``from chaoslib_infer import
    x`` / ``from . import x`` / ``from .x import y`` where ``y`` is a module (``x``, ``y``)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith("chaoslib_infer"):
                    continue
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    names["chaoslib_infer"] = "chaoslib_infer"
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(package, node)
            if not source.startswith("chaoslib_infer"):
                continue
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    names[alias.asname or alias.name] = f"{source}.{alias.name}"
    return names


def _dotted(node: ast.expr, names: dict[str, str]) -> str | None:
    """The module a ``m`` / ``m.sub.sub`` expression names, through ``names``; None if not one."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, names)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _private_reach_ins(modules: dict[str, Path]) -> list[str]:
    found = []
    for name, path in sorted(modules.items()):
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = _module_aliases(tree, package, modules)
        if not names:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            attr = node.attr
            if not attr.startswith("_") or attr.startswith("__"):
                continue
            source = _dotted(node.value, names)
            if source is None or source == name or source not in modules:
                continue
            if f"{source}.{attr}" not in modules:  # a private submodule is a module, not a name
                found.append(f"{name}:{node.lineno} reads {source}.{attr}")
    return found


def test_the_reach_in_finder_finds_a_reach_in(tmp_path: Path) -> None:
    pkg = tmp_path / "chaoslib_infer"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("_x = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text(
        "import chaoslib_infer.a as m\nfrom chaoslib_infer import a\nfrom .. import a as c\n"
        "import chaoslib_infer.a\n"
        "m._x, a._x, c._x, chaoslib_infer.a._x, m.__name__, m.public\n"
    )
    modules = {_module_name(p, pkg): p for p in pkg.rglob("*.py")}
    assert _private_reach_ins(modules) == [
        "chaoslib_infer.sub.b:5 reads chaoslib_infer.a._x" for _ in range(4)
    ]


def test_no_module_reads_another_modules_private_names() -> None:
    """``m._name`` on an imported package module is a reach-in too (dunder names excepted)."""
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    assert _private_reach_ins(modules) == []


#: Most lines a package module may have (issue 12: rooms of a readable size).
MAX_LINES = 600

#: Today's over-size modules, each with its line count as a ceiling: it may shrink (lower the
#: number, or drop the row once under ``MAX_LINES``), never grow past it.
OVERSIZE: dict[str, int] = {}


def test_no_module_grows_past_its_size_ceiling() -> None:
    sizes = {
        p.relative_to(PKG).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
        for p in PKG.rglob("*.py")
    }
    over = [
        f"{rel}: {n} lines > {OVERSIZE.get(rel, MAX_LINES)}"
        for rel, n in sorted(sizes.items())
        if n > OVERSIZE.get(rel, MAX_LINES)
    ]
    assert over == [], "split the module along its seams (issue 12)"
    stale = sorted(rel for rel in OVERSIZE if rel not in sizes)
    assert stale == [], "a listed module is gone: drop its row"
