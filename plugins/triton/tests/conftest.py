"""Fixtures of hwplug-triton's tests: without a GPU the kernels run in Triton's interpreter.

Triton (3.0 through 3.9) reads ``TRITON_INTERPRET`` whenever ``@triton.jit`` decorates a
function, and ``triton.language`` decorates its own helpers when triton is first
imported. The repository's conftest.py sets the variable before anything imports triton;
if triton was imported earlier without it, the kernel tests fail with that reason instead
of an interpreter error. This folder is put on ``sys.path`` for the shared test helpers
(``triton_cases``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ON_GPU = torch.cuda.is_available()
_TRITON_IMPORTED_UNINTERPRETED = (not ON_GPU and "triton" in sys.modules
                                  and os.environ.get("TRITON_INTERPRET") != "1")
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _triton_interpreter_ready() -> None:
    if _TRITON_IMPORTED_UNINTERPRETED:
        pytest.fail("triton was imported before TRITON_INTERPRET=1 was set; run these tests "
                    "in their own session or export TRITON_INTERPRET=1")


@pytest.fixture
def device() -> str:
    """Where the kernels run: ``"cuda"`` (NVIDIA or ROCm), or ``"cpu"`` through the Triton
    interpreter."""
    return "cuda" if ON_GPU else "cpu"
