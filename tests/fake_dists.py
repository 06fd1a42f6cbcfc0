"""Real installed distributions for discovery tests: ``*.dist-info`` folders on sys.path.

Each fake distribution is a folder with METADATA and entry_points.txt plus its module
files, exactly what pip would leave behind, so discovery runs its real code path.
"""

from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path


class FakeSite:
    """A temporary site directory; call :meth:`add` per distribution."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.tag = uuid.uuid4().hex[:8]

    def module(self, name: str) -> str:
        """A module name unique to this site, so repeated tests never share sys.modules."""
        return f"{name}_{self.tag}"

    def add(self, dist: str, entry_points: dict[str, dict[str, str]],
            modules: dict[str, str], version: str = "1.0") -> None:
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        lines = []
        for group, eps in entry_points.items():
            lines.append(f"[{group}]")
            lines.extend(f"{name} = {value}" for name, value in eps.items())
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        for module, source in modules.items():
            (self.root / f"{module}.py").write_text(textwrap.dedent(source))


def activate_site(site: FakeSite, monkeypatch) -> None:
    """Put ``site`` first on sys.path for the test (undone by monkeypatch)."""
    monkeypatch.syspath_prepend(str(site.root))
    sys.path_importer_cache.clear()
