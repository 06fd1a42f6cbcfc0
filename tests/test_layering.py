"""The layers import downward only, no modules import each other in a cycle, and every
source file stays small.

The import graph is computed from the source (:mod:`import_graph`): every import
statement counts, at module level, inside functions and under ``if TYPE_CHECKING:``. The
layers, lowest first (see :data:`LAYERS` and :func:`layer_of`):

* ``probes``: ``platforms/*.py`` and the CPU probe (``hwplug.platforms.cpu.probe`` and the
  package's ``__init__``);
* ``core``: the rest of ``core/`` (interfaces, discovery, registries), with the facade
  ``hwplug``; anything may import the facade, which reaches the layers above it only
  through lazy ``importlib.import_module`` calls of non-literal names;
* ``kernel_registry``; ``platform plugins`` (the rest of ``platforms/cpu/`` and every
  ``plugins/*/hwplug_*`` package); ``model_zoo``;
* ``entry points``: the CLI, the conformance kit, the plugin scaffold, the HTTP server
  (``hwplug.serve``) and ``__main__``.

A module may import modules of its own layer or of lower ones (type-only imports under
``if TYPE_CHECKING:`` included); the runtime never imports the conformance kit. No
modules import each other in a cycle through the statements that run (module-level and
function-level; type-only imports are annotations and may point back).
"""

from __future__ import annotations

import textwrap
from itertools import pairwise
from pathlib import Path

import pytest
from import_graph import Edge, ImportGraph, build_graph, cycle_in, strongly_connected_components

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("probes", "core", "kernel_registry", "platform plugins", "model_zoo", "entry points")
FACADE = "hwplug"
KIT = "hwplug.conformance"
ENTRY_POINTS = ("hwplug.cli", KIT, "hwplug.scaffold", "hwplug.serve", "hwplug.__main__")
CPU_PROBE = ("hwplug.platforms.cpu", "hwplug.platforms.cpu.probe")
SOURCE_FOLDERS = ("core", "platforms", "kernel_registry", "model_zoo", "plugins", "benchmarks",
                  "tests")
MAX_LINES = 400


def _within(module: str, package: str) -> bool:
    """``module`` is ``package`` or one of its submodules."""
    return module == package or module.startswith(package + ".")


def layer_of(module: str) -> str:
    """The layer (one of :data:`LAYERS`) of a library module.

    Raises ``ValueError`` for a module no rule covers (a new package under ``platforms/``):
    classify it here.
    """
    if module == FACADE:
        return "core"
    if any(_within(module, package) for package in ENTRY_POINTS):
        return "entry points"
    if module in CPU_PROBE:
        return "probes"
    if _within(module, "hwplug.platforms.cpu") or module.startswith("hwplug_"):
        return "platform plugins"
    if _within(module, "hwplug.platforms"):
        if module.count(".") <= 2:
            return "probes"
        raise ValueError(f"{module} is in no layer: classify it in layer_of")
    for package, layer in (("hwplug.kernel_registry", "kernel_registry"),
                           ("hwplug.model_zoo", "model_zoo")):
        if _within(module, package):
            return layer
    if _within(module, "hwplug"):
        return "core"
    raise ValueError(f"{module} is in no layer: classify it in layer_of")


def describe(edge: Edge) -> str:
    """``path:line: module -> imported (layer a -> layer b)[, function-level][, TYPE_CHECKING]``."""
    return (f"{edge.where}: {edge.source} -> {edge.target} "
            f"({layer_of(edge.source)} -> {layer_of(edge.target)}){edge.flags()}")


def upward_imports(graph: ImportGraph) -> list[str]:
    """Every import statement whose module sits in a higher layer than the importer's
    (importing the facade is always allowed), in :func:`describe`'s form."""
    return [describe(edge) for edge in graph.edges if edge.target != FACADE
            and LAYERS.index(layer_of(edge.target)) > LAYERS.index(layer_of(edge.source))]


def kit_imports(graph: ImportGraph) -> list[str]:
    """Every import of the conformance kit from outside the ``entry points`` layer."""
    return [f"runtime imports the conformance kit: {describe(edge)}" for edge in graph.edges
            if _within(edge.target, KIT) and layer_of(edge.source) != "entry points"]


def cycles(graph: ImportGraph) -> list[str]:
    """One report per strongly connected component of more than one module, through the
    statements that run: its modules, then one concrete cycle through them, an import
    statement per step (a module-level one where the step has one)."""
    successors = graph.successors(runtime=True)
    reports = []
    for component in strongly_connected_components(successors):
        if len(component) > 1:
            path = cycle_in(component, successors)
            steps = [min((edge for edge in graph.edges_between(source, target)
                          if not edge.type_checking), key=lambda edge: edge.function_level)
                     for source, target in pairwise(path)]
            reports.append(f"cycle among {len(component)} modules: {', '.join(component)}\n"
                           + "\n".join(f"    {describe(step)}" for step in steps))
    return reports


@pytest.fixture(scope="module")
def graph() -> ImportGraph:
    """The import graph of this repository's library code."""
    return build_graph(ROOT)


def test_the_graph_holds_the_library_modules_and_their_known_imports(graph):
    known = {"hwplug", "hwplug.__main__", "hwplug.platforms.cpu.probe",
             "hwplug.kernel_registry.dispatch", "hwplug_triton", "hwplug_cpu_arm"}
    assert known <= set(graph.modules)
    assert all(name.startswith("hwplug") for name in graph.modules)  # no tests, no benchmarks
    assert any(not edge.function_level and not edge.type_checking for edge
               in graph.edges_between("hwplug.kernel_registry.dispatch", "hwplug.errors"))
    assert any(edge.function_level for edge in graph.edges)
    assert any(edge.type_checking for edge in graph.edges)


def test_every_module_is_in_a_layer(graph):
    for module in graph.modules:
        assert layer_of(module) in LAYERS


SYNTHETIC = {
    "pyproject.toml": """
        [tool.setuptools]
        package-dir = { "hwplug" = "core", "hwplug.kernel_registry" = "kernel_registry" }
        """,
    "core/__init__.py": "",
    "core/errors.py": """
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            import hwplug.cli.main
        else:
            import hwplug.cli


        def fail():
            from hwplug.kernel_registry import dispatch, missing
        """,
    "core/cli/__init__.py": "from . import main\n",
    "core/cli/helpers.py": "",
    "core/cli/main.py": "import hwplug.conformance.kit\n",
    "core/conformance/__init__.py": "",
    "core/conformance/kit.py": "import hwplug.cli.helpers\n",
    "kernel_registry/__init__.py": "",
    "kernel_registry/dispatch.py": """
        import importlib

        from .. import errors

        importlib.import_module("hwplug.conformance.kit")
        importlib.import_module(errors.__name__)
        LAZY = "hwplug.cli.main:run"
        """,
    "plugins/demo/hwplug_demo/__init__.py": "import hwplug\nimport torch\n",
    "plugins/demo/tests/test_demo.py": "import hwplug.cli.main\n",
}


def test_the_checker_reports_a_synthetic_cycle_and_upward_imports(tmp_path):
    for name, text in SYNTHETIC.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text), encoding="utf-8")
    synthetic = build_graph(tmp_path)

    assert sorted(synthetic.modules) == [
        "hwplug", "hwplug.cli", "hwplug.cli.helpers", "hwplug.cli.main", "hwplug.conformance",
        "hwplug.conformance.kit", "hwplug.errors", "hwplug.kernel_registry",
        "hwplug.kernel_registry.dispatch", "hwplug_demo"]
    assert upward_imports(synthetic) == [  # importing a.b.c runs the packages a.b and a too
        "core/errors.py:5: hwplug.errors -> hwplug.cli (core -> entry points), TYPE_CHECKING",
        "core/errors.py:5: hwplug.errors -> hwplug.cli.main (core -> entry points), TYPE_CHECKING",
        "core/errors.py:7: hwplug.errors -> hwplug.cli (core -> entry points)",
        "core/errors.py:11: hwplug.errors -> hwplug.kernel_registry"
        " (core -> kernel_registry), function-level",
        "core/errors.py:11: hwplug.errors -> hwplug.kernel_registry.dispatch"
        " (core -> kernel_registry), function-level",
        "kernel_registry/dispatch.py:6: hwplug.kernel_registry.dispatch ->"
        " hwplug.conformance (kernel_registry -> entry points)",
        "kernel_registry/dispatch.py:6: hwplug.kernel_registry.dispatch ->"
        " hwplug.conformance.kit (kernel_registry -> entry points)"]
    assert kit_imports(synthetic) == [
        "runtime imports the conformance kit: kernel_registry/dispatch.py:6:"
        " hwplug.kernel_registry.dispatch -> hwplug.conformance"
        " (kernel_registry -> entry points)",
        "runtime imports the conformance kit: kernel_registry/dispatch.py:6:"
        " hwplug.kernel_registry.dispatch -> hwplug.conformance.kit"
        " (kernel_registry -> entry points)"]
    assert cycles(synthetic) == [
        "cycle among 3 modules: hwplug.cli, hwplug.cli.main, hwplug.conformance.kit\n"
        "    core/cli/__init__.py:1: hwplug.cli -> hwplug.cli.main"
        " (entry points -> entry points)\n"
        "    core/cli/main.py:1: hwplug.cli.main -> hwplug.conformance.kit"
        " (entry points -> entry points)\n"
        "    core/conformance/kit.py:1: hwplug.conformance.kit -> hwplug.cli"
        " (entry points -> entry points)",
        "cycle among 2 modules: hwplug.errors, hwplug.kernel_registry.dispatch\n"
        "    core/errors.py:11: hwplug.errors -> hwplug.kernel_registry.dispatch"
        " (core -> kernel_registry), function-level\n"
        "    kernel_registry/dispatch.py:4: hwplug.kernel_registry.dispatch -> hwplug.errors"
        " (kernel_registry -> core)"]


def test_each_layer_imports_only_its_own_and_lower_layers(graph):
    problems = upward_imports(graph)
    assert not problems, f"{len(problems)} upward imports:\n" + "\n".join(problems)


def test_the_runtime_never_imports_the_conformance_kit(graph):
    problems = kit_imports(graph)
    assert not problems, "\n".join(problems)


def test_no_modules_import_each_other_in_a_cycle(graph):
    problems = cycles(graph)
    assert not problems, f"{len(problems)} import cycles:\n" + "\n".join(problems)


def test_no_source_file_exceeds_the_size_limit():
    long = [f"{path.relative_to(ROOT)}: {n} lines"
            for folder in SOURCE_FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert not long, "\n".join(long)
