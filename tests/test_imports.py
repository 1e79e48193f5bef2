"""The package's modules import one another without a circle: every arrow of the import graph points down.

The graph is read from the source (``ast``), every ``import`` statement counted wherever it stands: at the top of
a module, inside a function (a deferred import, the usual way to hide a circle) or under ``TYPE_CHECKING``.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "attention_ref"


def module_name(path):
    """``attention_ref/testing/_rule.py`` -> ``attention_ref.testing._rule``; a package is its ``__init__``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules():
    """Every module of the package: name -> (path, whether it is a package)."""
    return {module_name(p): (p, p.name == "__init__.py") for p in sorted(PACKAGE.rglob("*.py"))}


def imported(node, here, is_package):
    """The absolute names an import statement `node` of module `here` names (modules, or names in modules)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # relative: from the module's package, one level up per extra dot
        base = here.split(".") if is_package else here.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        origin = ".".join([*base, *([node.module] if node.module else [])])
    else:
        origin = node.module
    return [origin, *(f"{origin}.{alias.name}" for alias in node.names)]


def import_graph():
    """module -> the set of the package's modules it imports (a ``from m import x`` names m, and m.x if x is a
    module); the parent package that Python runs first is not an arrow of its own."""
    known = modules()
    graph = {}
    for name, (path, is_package) in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets.update(t for t in imported(node, name, is_package) if t in known and t != name)
        graph[name] = targets
    return graph


def find_cycle(graph):
    """A list of modules ``[a, b, ..., a]`` that import one another in a circle, or None (depth-first search)."""
    state = {}  # module -> "open" while on the path, "done" once all its arrows are explored

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_the_graph_is_read_from_the_source():
    graph = import_graph()
    assert "attention_ref._attention_problem" in graph["attention_ref.blockwise"]
    assert "attention_ref._attention_problem" in graph["attention_ref.attention"]
    assert "attention_ref._online" in graph["attention_ref.attention"]
    assert "attention_ref._online" in graph["attention_ref.blockwise"]
    assert "attention_ref.blockwise" in graph["attention_ref"]  # the package's __init__ imports its modules


def test_the_cycle_finder_finds_a_deferred_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
    source = "import numpy\n\ndef f():\n    from .attention import x\n"
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom))
    assert imported(node, "attention_ref.blockwise", False)[0] == "attention_ref.attention"
    node = ast.parse("from .._kernel import run_blocks").body[0]
    assert imported(node, "attention_ref.testing._rule", False)[0] == "attention_ref._kernel"
    node = ast.parse("from ._rule import errors").body[0]
    assert imported(node, "attention_ref.testing", True)[0] == "attention_ref.testing._rule"


def test_no_module_of_the_package_imports_itself_through_others():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def private_imports(source: str, here: str, is_package: bool) -> list[str]:
    """``module.name`` for each private name (``_x``, not a dunder) that `source` imports from a module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            origin = imported(node, here, is_package)[0]
            found += [f"{origin}.{alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_the_private_import_finder_sees_relative_and_deferred_imports():
    source = "from ._online import online_update\n\ndef f():\n    from ..backward import _sum_to, sum_groups\n"
    assert private_imports(source, "attention_ref.testing._x", False) == ["attention_ref.backward._sum_to"]
    assert private_imports("from . import _kernel\nfrom __future__ import annotations\n", "attention_ref",
                           True) == ["attention_ref._kernel"]


def test_no_module_imports_a_private_name_of_another():
    """A name another module needs is not private: it is named without the underscore where it is defined
    (private modules, whose names start with one, may be imported whole)."""
    known = modules()
    found = []
    for name, (path, is_package) in known.items():
        found += [f"{name}: {target}" for target in
                  private_imports(path.read_text(encoding="utf-8"), name, is_package) if target not in known]
    assert found == []
