"""Fixtures of hwplug-rocm-aiter's tests. Its kernels over ``ROCM_PA`` are hwplug-triton's
run through a view of the layout, so their tests share hwplug-triton's test helpers
(``triton_cases``, put on ``sys.path`` here) and run in Triton's interpreter without a GPU
(the repository's conftest.py sets ``TRITON_INTERPRET``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "triton" / "tests"))


@pytest.fixture
def device() -> str:
    """``"cuda"`` on a ROCm GPU (torch's name for it), else ``"cpu"`` (the interpreter)."""
    return "cuda" if torch.cuda.is_available() else "cpu"
