"""The import graph of hwplug's library code, computed from the source with :mod:`ast`.

Contracts:

* :func:`library_modules` names every ``.py`` file of the library: the folders that
  ``pyproject.toml``'s ``[tool.setuptools] package-dir`` maps to import packages, and each
  plugin's import package ``plugins/<name>/hwplug_<name with underscores>/``. Tests,
  benchmarks and plugin tests are not library code. A package's ``__init__.py`` is the node
  of the package itself.
* :func:`build_graph` records one :class:`Edge` per import statement anywhere in a file
  (module level, in functions and classes, under ``if TYPE_CHECKING:``), and per call of
  ``importlib.import_module`` / ``import_module`` with a literal module name. Relative
  imports are resolved; ``from a.b import c`` points at the module ``a.b.c`` when it is one,
  else at ``a.b``. Importing ``a.b.c`` also runs the packages ``a`` and ``a.b`` first: the
  statement points at them too, unless the importer lies inside them. Imports of anything outside the graph (the standard library, third-party
  packages) are dropped. Strings naming a module for lazy loading are data, not edges.
* :func:`strongly_connected_components` and :func:`cycle_in` find the cycles.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class Edge:
    """One import statement of ``source`` that loads the library module ``target``."""

    source: str
    target: str
    where: str  #: ``path:line`` of the statement, the path relative to the repository root
    function_level: bool  #: the statement runs inside a function or method
    type_checking: bool  #: the statement sits under ``if TYPE_CHECKING:``

    def flags(self) -> str:
        """``, function-level`` and ``, TYPE_CHECKING`` as they apply (else empty)."""
        return (", function-level" if self.function_level else "") + (
            ", TYPE_CHECKING" if self.type_checking else "")


@dataclass
class ImportGraph:
    """Library modules (dotted name -> file) and the import edges between them."""

    modules: dict[str, Path]
    edges: list[Edge]

    def successors(self, runtime: bool = False) -> dict[str, set[str]]:
        """Module -> the modules it imports (every module is a key); with ``runtime``, only
        through statements that run (not under ``if TYPE_CHECKING:``)."""
        out: dict[str, set[str]] = {name: set() for name in self.modules}
        for edge in self.edges:
            if not (runtime and edge.type_checking):
                out[edge.source].add(edge.target)
        return out

    def edges_between(self, source: str, target: str) -> list[Edge]:
        """The statements of ``source`` that import ``target``, in file order."""
        return [e for e in self.edges if e.source == source and e.target == target]


def library_modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every library ``.py`` file under ``root``.

    A file under several mapped folders belongs to the deepest one.
    """
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    folders = {root / folder: package for package, folder
               in pyproject["tool"]["setuptools"]["package-dir"].items()}
    for plugin in sorted((root / "plugins").glob("*/")):
        package = "hwplug_" + plugin.name.replace("-", "_")
        if (plugin / package).is_dir():
            folders[plugin / package] = package
    modules: dict[str, Path] = {}
    for folder in sorted(folders, key=lambda f: len(f.parts)):  # deeper folders override
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((folders[folder], *parts))] = path
    return modules


def build_graph(root: Path) -> ImportGraph:
    """The import graph of the library modules under ``root`` (see the module docstring).

    A module importing itself (a package naming its own ``__init__``) adds no edge.
    """
    modules = library_modules(root)
    edges: list[Edge] = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        where = path.relative_to(root).as_posix()
        for node, in_function, in_type_checking in _imports(tree):
            targets = [loaded for target in _targets(node, package, modules)
                       for loaded in _with_parents(target, name)]
            edges.extend(Edge(name, target, f"{where}:{node.lineno}", in_function,
                              in_type_checking)
                         for target in dict.fromkeys(targets)
                         if target in modules and target != name)
    return ImportGraph(modules, edges)


def _with_parents(target: str, source: str) -> list[str]:
    """``target`` and the packages whose ``__init__`` importing it runs first (``a`` and
    ``a.b`` for ``a.b.c``), except those ``source`` lies in: they are initialised (at
    least partly) before ``source`` runs."""
    parts = target.split(".")
    parents = [".".join(parts[:depth]) for depth in range(1, len(parts))]
    return [parent for parent in parents
            if not (source == parent or source.startswith(parent + "."))] + [target]


def _imports(node: ast.AST, in_function: bool = False, in_type_checking: bool = False,
             ) -> Iterator[tuple[ast.Import | ast.ImportFrom | ast.Call, bool, bool]]:
    """Every import statement and literal ``import_module`` call under ``node``, with
    whether it runs inside a function and whether it sits under ``if TYPE_CHECKING:``
    (its ``else:`` branch runs as usual)."""
    if isinstance(node, ast.Import | ast.ImportFrom) or _is_literal_import_module(node):
        yield node, in_function, in_type_checking
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        branches = [(node.body, True), (node.orelse, in_type_checking)]
    else:
        in_function = in_function or isinstance(
            node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        branches = [(list(ast.iter_child_nodes(node)), in_type_checking)]
    for children, type_checking in branches:
        for child in children:
            yield from _imports(child, in_function, type_checking)


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_literal_import_module(node: ast.AST) -> bool:
    """A call ``importlib.import_module("a.b")`` or ``import_module("a.b")``."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    func, first = node.func, node.args[0]
    named = (isinstance(func, ast.Name) and func.id == "import_module") or (
        isinstance(func, ast.Attribute) and func.attr == "import_module"
        and isinstance(func.value, ast.Name) and func.value.id == "importlib")
    return named and isinstance(first, ast.Constant) and isinstance(first.value, str)


def _targets(node: ast.Import | ast.ImportFrom | ast.Call, package: str,
             modules: dict[str, Path]) -> list[str]:
    """The absolute module names that ``node`` (inside ``package``) loads, one per name."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.Call):
        return [node.args[0].value]
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join([*parts[:len(parts) - node.level + 1], *([base] if base else [])])
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
            for alias in node.names]


def strongly_connected_components(successors: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component (Tarjan, iterative), each sorted by name.

    Components come out deterministically: in reverse topological order of the
    condensation, starting from the alphabetically first module.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    work: list[tuple[str, Iterator[str]]] = []

    def enter(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        work.append((node, iter(sorted(successors[node]))))

    for start in sorted(successors):
        if start not in index:
            enter(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    enter(child)
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while not component or component[-1] != node:
                        component.append(stack.pop())
                        on_stack.discard(component[-1])
                    components.append(sorted(component))
    return components


def cycle_in(component: list[str], successors: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through ``component[0]`` inside the component: ``[m0, ..., m0]``.

    ``component`` must be strongly connected with more than one module.
    """
    start, members = component[0], set(component)
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(successors[node] & members):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if child not in parent:
                parent[child] = node
                queue.append(child)
    raise ValueError(f"no cycle through {start} in {component}")
