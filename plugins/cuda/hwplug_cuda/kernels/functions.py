"""Device functions shared by the kernels, built from core ``triton.language`` ops only
(libdevice names and ``tl.math`` contents differ across Triton 3.x releases)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tanh(x):
    """``tanh(x)`` in fp32 as ``sign(x) * (1 - e) / (1 + e)``, ``e = exp(-2|x|)``: no
    overflow for any finite ``x``."""
    e = tl.exp(-2.0 * tl.abs(x))
    magnitude = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0.0, -magnitude, magnitude)
