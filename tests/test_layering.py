"""The layers talk downward only, and every source file stays small.

The probes (``platforms/*.py``) and ``core`` (the interfaces, discovery, registries, CLI
and kit) never import the kernel registry, the model zoo or a plugin: core reaches them
only through the lazy public facade (``hwplug.ops``, ``hwplug.kernels``, ``hwplug.LLM``).
The built-in CPU platform (``platforms/cpu/``) is built like a plugin: it may use the
kernel registry, never the model zoo. The kernel registry never imports the model zoo or
a plugin, and the model zoo no plugin. Imports under ``if TYPE_CHECKING:`` are
annotations, not dependencies, and are allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: file pattern -> import prefixes its files must not use.
FORBIDDEN = {
    "platforms/*.py": ("hwplug.kernel_registry", "hwplug.model_zoo", "hwplug_"),
    "platforms/cpu/**/*.py": ("hwplug.model_zoo", "hwplug_"),
    "core/**/*.py": ("hwplug.kernel_registry", "hwplug.model_zoo", "hwplug_"),
    "kernel_registry/**/*.py": ("hwplug.model_zoo", "hwplug_"),
    "model_zoo/**/*.py": ("hwplug_",),
}
SOURCE_FOLDERS = ("core", "platforms", "kernel_registry", "model_zoo", "plugins", "benchmarks",
                  "tests")
MAX_LINES = 400


def _runtime_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import outside ``if TYPE_CHECKING:`` blocks."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


@pytest.mark.parametrize("pattern", sorted(FORBIDDEN))
def test_each_layer_imports_only_the_layers_below(pattern):
    problems = []
    for path in sorted(ROOT.glob(pattern)):
        for line, module in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if module.startswith(FORBIDDEN[pattern]):
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not problems, "\n".join(problems)


def test_no_source_file_exceeds_the_size_limit():
    long = [f"{path.relative_to(ROOT)}: {n} lines"
            for folder in SOURCE_FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert not long, "\n".join(long)
