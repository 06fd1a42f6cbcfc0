"""The public API is declared in one place and the guides use only it.

docs/make_api.py lists the public modules; a name is public when its module names it in
``__all__``. docs/api.md is generated from them (it must be current), and every hwplug
import in the guides' code (docs/*.md, README.md, the ``hwplug new-plugin`` templates)
names a public module or a public name.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
from make_api import PUBLIC, module_names  # noqa: E402

PUBLIC_MODULES = {module for modules in PUBLIC.values() for module in modules}
FENCE = re.compile(r"```python\n(.*?)```", re.S)


def guide_sources() -> list[tuple[str, str]]:
    """``(where, python source)`` of every code block of the guides and every template."""
    sources = [(f"{path.name} block {i}", block)
               for path in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
               for i, block in enumerate(FENCE.findall(path.read_text(encoding="utf-8")))]
    sources += [(path.name, path.read_text(encoding="utf-8")) for path
                in sorted((ROOT / "core" / "scaffold" / "template").rglob("*.py.tmpl"))]
    return sources


def hwplug_imports(source: str) -> list[tuple[str, str | None]]:
    """``(module, name)`` of each ``from hwplug... import name`` and ``(module, None)`` of
    each ``import hwplug...`` in ``source`` (blocks that are not Python parse to none)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hwplug":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names
                      if alias.name.split(".")[0] == "hwplug"]
    return found


def test_docs_api_md_is_generated_from_the_modules():
    out = subprocess.run([sys.executable, str(ROOT / "docs" / "make_api.py"), "--check"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("module", sorted(PUBLIC_MODULES))
def test_every_public_module_declares_what_it_exports(module):
    names = module_names(module)
    imported = importlib.import_module(module)
    assert names == sorted(set(names), key=names.index), f"{module}.__all__ repeats a name"
    for name in names:
        assert hasattr(imported, name), f"{module}.__all__ names {name}, which it lacks"


def test_the_guides_import_only_public_names():
    problems = []
    for where, source in guide_sources():
        for module, name in hwplug_imports(source):
            if name is None:
                ok = module in PUBLIC_MODULES
            else:
                ok = f"{module}.{name}" in PUBLIC_MODULES or (
                    module in PUBLIC_MODULES and name in module_names(module))
            if not ok:
                problems.append(f"{where}: {module}{'.' + name if name else ''}")
    assert not problems, "not in the public API (docs/make_api.py):\n" + "\n".join(problems)


def test_the_checker_sees_a_private_import():
    assert hwplug_imports("from hwplug.model_zoo.engine.scheduler import Scheduler\n"
                          "import hwplug.registry\n") == [
        ("hwplug.model_zoo.engine.scheduler", "Scheduler"), ("hwplug.registry", None)]
    assert "hwplug.model_zoo.engine.scheduler" not in PUBLIC_MODULES
