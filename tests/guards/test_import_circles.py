"""No import circle anywhere in src/conveyor: the modules import one another
as a graph without cycles, so each can be read (and imported) after the ones
it uses.

The imports are read as text with `ast`, every `import` and `from ... import`
at any depth (inside functions and `if TYPE_CHECKING:` blocks too, since a
circle hidden in a function is still a circle of meaning). Relative imports
are resolved to module names; `from package import name` counts as importing
the package's `__init__` and, when `name` is a submodule, that submodule.
Package `__init__` modules are nodes like any other. A circle is a strongly
connected component of more than one module (Tarjan's algorithm, iterative).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "conveyor"

#: Imports that still close a circle through a package's __init__, each a
#: `from <package> import <submodule>` in a module being reshaped (issue 22):
#: ``from ... import rng`` imports conveyor/__init__, which imports the loader,
#: which imports these modules. Each goes once its module imports from the
#: defining one (``from ...rng import derive_seed``); the graph is checked
#: without them, and a line whose import is gone must go too.
WAITING: set = set()


def module_files(src: Path = SRC, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of `package` under `src`, by dotted name; a package's
    `__init__.py` is named for the package (``conveyor.stats``)."""
    modules = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _base_package(module: str, is_package: bool, level: int) -> str:
    """The package a relative import of `level` dots in `module` starts from."""
    parts = module.split(".")
    if not is_package:
        parts.pop()
    return ".".join(parts[: len(parts) - (level - 1)])


def _known_prefix(name: str, modules: dict[str, Path]) -> str | None:
    """The longest leading part of `name` that is one of the modules (an
    attribute path such as ``conveyor.rng.derive_seed`` names ``conveyor.rng``)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def imported_modules(module: str, modules: dict[str, Path]) -> set[str]:
    """The modules of the package that `module`'s text imports."""
    path = modules[module]
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _known_prefix(alias.name, modules)
                if target is not None:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _base_package(module, is_package, node.level)
                if node.module:
                    base = f"{base}.{node.module}"
            else:
                base = node.module or ""
            target = _known_prefix(base, modules)
            if target is None:
                continue
            found.add(target)
            if target == base:
                for alias in node.names:
                    if f"{base}.{alias.name}" in modules:
                        found.add(f"{base}.{alias.name}")
    found.discard(module)
    return found


def import_graph(src: Path = SRC, package: str = PACKAGE) -> dict[str, set[str]]:
    """Each module of the package, with the package's modules it imports."""
    modules = module_files(src, package)
    return {module: imported_modules(module, modules) for module in modules}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of `graph`, without recursion."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        # Each frame: a node and the iterator over what it imports not yet visited.
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module."""
    return sorted(component for component in strongly_connected(graph) if len(component) > 1)


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    edges = [f"    {module} -> {target}" for module in component for target in sorted(graph[module] & members)]
    return f"  {', '.join(component)}:\n" + "\n".join(edges)


def test_no_module_of_conveyor_imports_itself_in_a_circle():
    graph = import_graph()
    for module, target in WAITING:
        graph.get(module, set()).discard(target)
    found = circles(graph)
    assert not found, (
        f"{len(found)} import circle(s) in src/{PACKAGE} (move the names both sides need into a lower module that "
        "both import; a submodule imports from the module that defines a name, not from its package's __init__):\n"
        + "\n".join(_describe(component, graph) for component in found)
    )


def test_every_waiting_import_is_still_there():
    graph = import_graph()
    gone = sorted((module, target) for module, target in WAITING if target not in graph.get(module, set()))
    assert not gone, f"these imports are gone; remove them from WAITING in {Path(__file__).name}: {gone}"


def test_the_graph_sees_relative_imports_and_submodules_named_in_from_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import a\nimport pkg.sub.c\n")
    (pkg / "sub" / "c.py").write_text("from pkg.sub import b\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.sub", "pkg.sub.b"},
        "pkg.sub": set(),
        "pkg.sub.b": {"pkg", "pkg.a", "pkg.sub.c"},
        "pkg.sub.c": {"pkg.sub", "pkg.sub.b"},
    }
    assert circles(graph) == [["pkg", "pkg.a", "pkg.sub.b", "pkg.sub.c"]]


def test_tarjan_finds_a_long_chain_without_recursion():
    chain = {f"m{i}": {f"m{i + 1}"} for i in range(5000)}
    chain["m5000"] = {"m0"}
    assert [len(component) for component in circles(chain)] == [5001]
    chain["m5000"] = set()
    assert circles(chain) == []
