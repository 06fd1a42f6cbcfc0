"""Set-up for every test session in this repository (core and plugin tests alike).

Without a GPU, hwplug-cuda's Triton kernels run in Triton's interpreter, which Triton
picks from ``TRITON_INTERPRET`` when it is first imported. This file is loaded before any
test module, so the variable is set before anything (transformers, the conformance kit)
can import triton.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
