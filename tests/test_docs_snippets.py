"""Every ```python block of every docs/*.md runs, in order, in one fresh namespace per document.

Each document runs in its own interpreter, so what its snippets register never leaks into
other tests. Tracebacks point at the document's own line numbers. A block may be skipped
only with a reason, by an HTML comment on the line just above its fence:
``<!-- snippet: skip (needs a GPU) -->``. ```bash (and other) blocks are not run.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
FENCE = re.compile(r"^```(\w*)\s*$")
SKIP = re.compile(r"^<!--\s*snippet:\s*skip\s*\((?P<reason>[^)]*)\)\s*-->\s*$")

#: Runs the blocks given as JSON on stdin ([[path, first_line, code], ...]).
RUNNER = """
import json, sys
namespace = {"__name__": "__doc_snippets__"}
for path, first_line, code in json.load(sys.stdin):
    exec(compile("\\n" * (first_line - 1) + code, path, "exec"), namespace)
"""


@dataclass(frozen=True)
class Snippet:
    first_line: int  # 1-based line of the block's first code line
    code: str
    skip_reason: str | None


def snippets(text: str) -> list[Snippet]:
    """The ```python blocks of a Markdown text, with their skip markers."""
    found, lines = [], text.splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        if match.group(1) == "python":
            marker = SKIP.match(lines[index - 1]) if index else None
            found.append(Snippet(index + 2, "\n".join(lines[index + 1:end]) + "\n",
                                 marker.group("reason").strip() if marker else None))
        index = end + 1
    return found


def test_skip_markers_need_a_reason():
    text = "<!-- snippet: skip () -->\n```python\nraise SystemExit\n```\n"
    assert snippets(text)[0].skip_reason == ""
    text = "<!-- snippet: skip (needs a GPU) -->\n```python\nx = 1\n```\n```bash\nls\n```\n"
    assert snippets(text) == [Snippet(3, "x = 1\n", "needs a GPU")]


#: The documents with at least one ```python block.
DOCS_WITH_CODE = [doc for doc in sorted(DOCS.glob("*.md"))
                  if snippets(doc.read_text(encoding="utf-8"))]


def test_the_guides_have_code_to_run():
    names = {doc.name for doc in DOCS_WITH_CODE}
    assert {"plugin-authoring.md", "model-authoring.md"} <= names


@pytest.mark.slow  # most guides load the real model in a fresh interpreter
@pytest.mark.parametrize("doc", DOCS_WITH_CODE, ids=lambda p: p.name)
def test_snippets_run(doc: Path):
    blocks = snippets(doc.read_text(encoding="utf-8"))
    empty_reasons = [s.first_line for s in blocks if s.skip_reason == ""]
    assert not empty_reasons, f"{doc.name}: skip markers without a reason at {empty_reasons}"
    runnable = [[str(doc), s.first_line, s.code] for s in blocks if s.skip_reason is None]
    if not runnable:
        pytest.skip(f"every python snippet of {doc.name} is marked skip")
    proc = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(runnable),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
