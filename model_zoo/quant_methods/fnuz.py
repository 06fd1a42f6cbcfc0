"""OCP e4m3 fp8 weights for a device that computes in e4m3fnuz (AMD gfx942), as vLLM
converts them (``normalize_e4m3fn_to_e4m3fnuz``).

The same byte read as e4m3fnuz is half the e4m3fn value (exponent bias 8 instead of 7),
so the weights keep their bytes and their scales double; the one byte whose meaning
differs otherwise, ``0x80`` (e4m3fn's negative zero, e4m3fnuz's NaN), becomes ``0x00``.
The dequantized weight is unchanged: ``fnuz * 2 * scale == e4m3fn * scale`` exactly.
"""

from __future__ import annotations

import torch

#: The byte that is -0.0 in e4m3fn and NaN in e4m3fnuz, as int8.
FNUZ_NAN = -128


def e4m3fn_to_fnuz(weight: torch.Tensor, scale: torch.Tensor,
                   input_scale: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``weight`` (``float8_e4m3fn``) as ``float8_e4m3fnuz`` and the doubled ``scale``
    (and static ``input_scale``, since activations are quantized to fnuz with it)."""
    if weight.dtype != torch.float8_e4m3fn:
        raise TypeError(f"expected float8_e4m3fn weights, got {weight.dtype}")
    raw = weight.view(torch.int8).clone()
    raw[raw == FNUZ_NAN] = 0
    doubled = None if input_scale is None else input_scale * 2
    return raw.view(torch.float8_e4m3fnuz), scale * 2, doubled
