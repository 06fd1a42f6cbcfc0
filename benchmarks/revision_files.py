"""Files as an earlier git revision holds them, for the benchmarks that build that
revision's C kernels beside this one's (``--baseline REV``)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path


def files_at(rev: str, directory: str, suffixes: tuple[str, ...], prefix: str,
             subfolder: str = "") -> Path:
    """Write every file of the repository's ``directory`` (``"platforms/cpu/fused/"``)
    ending in one of ``suffixes`` as revision ``rev`` holds it into
    ``$TMPDIR/<prefix>-<rev>/<subfolder>/``, by file name; return that folder."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                              text=True).stdout

    root = Path(__file__).resolve().parents[1]  # the repository
    safe = "".join(c if c.isalnum() else "-" for c in rev)
    folder = Path(tempfile.gettempdir()) / f"{prefix}-{safe}" / subfolder
    folder.mkdir(parents=True, exist_ok=True)
    for path in git("ls-tree", "--name-only", rev, directory).split():
        if path.endswith(suffixes):
            (folder / Path(path).name).write_text(git("show", f"{rev}:{path}"))
    return folder
