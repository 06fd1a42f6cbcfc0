"""Matrix multiplies: the dense ``linear`` of every unquantized layer and the scaled GEMM
that fp8 (and other low-precision) weights use."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """``x [..., K] @ weight [N, K].T + bias [N]`` -> ``[..., N]`` in ``x.dtype``, through
    ``F.linear`` (every torch backend accumulates in fp32)."""
    return F.linear(x, weight, bias)


def scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``((a * scale_a) @ (b * scale_b) + bias).to(out_dtype)``, computed in fp32.

    ``a [M, K]`` and ``b [K, N]`` may have any float dtype (fp8 e4m3/e5m2 on GPUs);
    ``scale_a`` is a scalar or ``[M, 1]`` (per token), ``scale_b`` a scalar or ``[1, N]``
    (per channel), both fp32; ``bias`` is ``[N]`` or None. Returns ``[M, N]`` in ``out_dtype``.
    """
    out = (a.float() * scale_a.float()) @ (b.float() * scale_b.float())
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)
