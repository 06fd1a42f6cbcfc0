"""Fixtures of hwplug-cuda's tests: without a GPU the Triton kernels run in the interpreter.

Triton (3.0 through 3.9) reads ``TRITON_INTERPRET`` whenever ``@triton.jit`` decorates a
function, and ``triton.language`` decorates its own helpers (``tl.zeros``, ``tl.cdiv``,
...) when triton is first imported. So the variable is set here, before anything
imports triton (importing torch does not); if triton was imported earlier in the session
without it, the kernel tests fail with that reason instead of an interpreter error.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

ON_GPU = torch.cuda.is_available()
_TRITON_IMPORTED_UNINTERPRETED = (not ON_GPU and "triton" in sys.modules
                                  and os.environ.get("TRITON_INTERPRET") != "1")
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def _triton_interpreter_ready() -> None:
    if _TRITON_IMPORTED_UNINTERPRETED:
        pytest.fail("triton was imported before TRITON_INTERPRET=1 was set; run these tests "
                    "in their own session or export TRITON_INTERPRET=1")


@pytest.fixture
def device() -> str:
    """Where the kernels run: ``"cuda"``, or ``"cpu"`` through the Triton interpreter."""
    return "cuda" if ON_GPU else "cpu"
