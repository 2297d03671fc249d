"""The package's shape (docs/architecture.md): no import cycle between its modules,
lazy imports included; no module over the size a reader takes in at once; no path
that reaches outside the package (it must work installed as a wheel)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "msar_export"
MAX_LINES = 420  # "about 400" (issue 13)


def modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(PKG.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return out


def imports(mods) -> dict[str, set[str]]:
    """Every msar_export module each module imports, at module level or inside a function."""
    graph = {}
    for name, (f, is_pkg) in mods.items():
        edges = set()
        for node in ast.walk(ast.parse(f.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_pkg else name.split(".")[:-1]
                    here = here[: len(here) - (node.level - 1)]
                    base = ".".join(here + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            edges |= {t for t in targets if t in mods and t != name}
        graph[name] = edges
    return graph


def cycles(graph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert cycles(imports(modules())) == []


def test_cycle_finder_finds_one():  # the negative control of the test above
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_over_the_limit():
    sizes = {n: len(f.read_text().splitlines()) for n, (f, _) in modules().items()}
    assert {n: s for n, s in sizes.items() if s > MAX_LINES} == {}


def test_no_path_reaches_outside_the_package():
    pattern = re.compile(r"__file__\)?(\.resolve\(\))?\.parents\[\d\]|__file__\)?(\.resolve\(\))?\.parent\.parent")
    found = [f"{f.relative_to(PKG.parent)}:{i}" for f, _ in modules().values()
             for i, line in enumerate(f.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []
