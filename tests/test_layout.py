"""The package's shape (docs/architecture.md): every import, lazy ones included, goes
down the floors the document draws and none forms a cycle; no module over the size a
reader takes in at once; no path that reaches outside the package (it must work
installed as a wheel)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "msar_export"
DOC = PKG.parent / "docs" / "architecture.md"
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


# The floors are read from the drawing itself, so the document and this test cannot disagree.
_NAME = re.compile(r"^[a-z_0-9]+(/|\.py)$")


def floors_from(markdown: str) -> list[list[str]]:
    """The drawing's floors, top first: one per row, each a list of entries ("serving/load/",
    "cli.py"). A package row names its package (the words after it are its modules); a
    module row names every module it starts with. Rows that continue a description are
    skipped; the drawing of the package ends at the first row outside its tree."""
    rows = markdown.split("```", 2)[1].splitlines()[1:]
    floors, parents = [], {}
    for i, row in enumerate(rows):
        if i and row[:1] not in (" ", "│", "├", "└"):
            break
        rest = row.lstrip(" │├└─")
        words = rest.split()
        if not words or not _NAME.match(words[0]):
            continue
        depth = (len(row) - len(rest) + 2) // 4 if i else 0
        if words[0].endswith("/"):
            parents[depth] = parents.get(depth - 1, "") + words[0]
            floors.append([parents[depth]])
        else:
            floors.append([w for w in _leading(words) if w.endswith(".py")])
    return floors


def _leading(words):
    for w in words:
        if not _NAME.match(w):
            return
        yield w


def entry_of(module: str, entries) -> str | None:
    """The drawn entry a module belongs to: its own row, else its deepest drawn package."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__.py" if "__init__.py" in entries else None
    for n in range(len(parts), 0, -1):
        for name in ("/".join(parts[:n]) + "/", "/".join(parts[:n]) + ".py"):
            if name in entries:
                return name
    return None


def floor_violations(graph, floors) -> list[str]:
    """Every import that does not go to a lower floor (upwards, or sideways to another entry
    of its own floor); imports inside one entry are the cycle test's."""
    level = {e: i for i, floor in enumerate(floors) for e in floor}
    out = []
    for a, targets in sorted(graph.items()):
        ea = entry_of(a, level)
        for b in sorted(targets):
            eb = entry_of(b, level)
            if None not in (ea, eb) and ea != eb and level[eb] <= level[ea]:  # undrawn: the test above
                out.append(f"{a} -> {b} ({ea} floor {level[ea]} -> {eb} floor {level[eb]})")
    return out


def test_every_module_is_drawn_and_every_drawn_name_exists():
    floors = floors_from(DOC.read_text())
    entries = {e for floor in floors for e in floor}
    assert sorted(n for n in modules() if entry_of(n, entries) is None) == []
    assert sorted(e for e in entries if e != "__init__.py" and not (PKG / e).exists()) == []


def test_imports_go_down_the_drawn_floors():
    assert floor_violations(imports(modules()), floors_from(DOC.read_text())) == []


def test_floor_check_finds_an_upward_and_a_sideways_import():  # the negative control of the two above
    drawing = """```
cli.py
 ├─ app/   cli.py           the top stage
 │   └─ load/                   drawn inside app/
 │          more text          a description that goes on
 ├─ low.py side.py          two modules on one floor
 └─ errors.py
plugins/                    not the package
```"""
    floors = floors_from(drawing)
    assert floors == [["cli.py"], ["app/"], ["app/load/"], ["low.py", "side.py"], ["errors.py"]]
    graph = {"p.cli": {"p.app.cli", "p.errors"}, "p.app.cli": {"p.app.load.job", "p.app.x"},
             "p.app.load.job": {"p.app.x", "p.low"}, "p.low": {"p.side", "p.errors"}, "p.errors": set()}
    assert floor_violations(graph, floors) == ["p.app.load.job -> p.app.x (app/load/ floor 2 -> app/ floor 1)",
                                               "p.low -> p.side (low.py floor 3 -> side.py floor 3)"]


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


# Library code never prints (docs/architecture.md, "Output"): it returns values and reports through
# a `progress` callable or its logger. A command's own modules (`cli*.py`) print its result, and a
# process's `main` (or `__main__` block) may print what that process exists to say.
PRINTS_ALLOWED = {
    "msar_export.serving.load.job": "the load-test process: its reports are its output, relayed by the parent",
    "msar_export.serving.repository.triton_model": "runs inside tritonserver: its stdout is the server log",
}


def prints(tree: ast.AST) -> list[int]:
    """Lines that print outside a `main` function and a `__main__` block: print, called or handed
    on as a callback (`say=print`), sys.stdout.write / sys.stderr.write."""
    found = []

    def visit(node, allowed):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "main":
            allowed = True
        if isinstance(node, ast.If) and "__main__" in ast.dump(node.test):
            allowed = True
        if not allowed and ((isinstance(node, ast.Name) and node.id == "print") or (
                isinstance(node, ast.Attribute) and node.attr == "write" and isinstance(node.value, ast.Attribute)
                and node.value.attr in ("stdout", "stderr") and getattr(node.value.value, "id", None) == "sys")):
            found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, allowed)

    visit(tree, False)
    return found


def test_library_code_never_prints():
    found = {n: prints(ast.parse(f.read_text())) for n, (f, _) in modules().items()
             if not n.rsplit(".", 1)[-1].startswith("cli") and n not in PRINTS_ALLOWED}
    assert {n: lines for n, lines in found.items() if lines} == {}
    assert all(n in modules() for n in PRINTS_ALLOWED)  # an allowance outlives no module


def test_print_finder_finds_each_kind():  # the negative control of the test above
    source = '''
import sys
def work():
    print("a")
    sys.stderr.write("b")
    log = lambda m: print(m)
def run(say=print):
    pass
def main():
    print("c")
if __name__ == "__main__":
    sys.stdout.write("d")
text = "print('e')"
'''
    assert prints(ast.parse(source)) == [4, 5, 6, 7]
