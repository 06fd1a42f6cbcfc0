"""int8 ``scaled_mm`` variants on CPUs, through torch's int8 GEMMs.

- :func:`int_mm`: W8A8, ``torch._int_mm`` on int8 activations and weights (int32
  accumulation), then the per-token and per-channel scales. On CPUs without VNNI, torch's
  kernel is a plain loop: measured 4-12x slower than the float reference on a 2-core AVX2
  EPYC at the SmolLM2 shapes, so it is registered for CPUs with ``avx512_vnni``.
- :func:`weight_only`: W8A16, ``torch.ops.aten._weight_int8pack_mm`` on bf16 activations
  and int8 weights with per-channel scales (measured faster than bf16 and fp32 dense
  ``F.linear`` at batch 1 to 32 on the same AVX2 CPU; with fp32 activations torch's kernel
  is 7-40x slower, so only bf16 is declared).
"""

from __future__ import annotations

import torch


def _scale_problem(scale: torch.Tensor, per_row: tuple[int, int], what: str) -> str | None:
    if scale.numel() == 1 or tuple(scale.shape) == per_row:
        return None
    return f"{what} scales must be one value or {list(per_row)}, got {list(scale.shape)}"


def int_mm_supported(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                     scale_b: torch.Tensor, out_dtype: torch.dtype,
                     bias: torch.Tensor | None = None) -> str | None:
    """Why :func:`int_mm` declines a call, or None."""
    if b.dtype != torch.int8:
        return f"needs int8 weights, got {b.dtype}"
    return (_scale_problem(scale_a, (a.shape[0], 1), "activation")
            or _scale_problem(scale_b, (1, b.shape[1]), "weight"))


def int_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
           out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The ``scaled_mm`` op for int8 ``a`` and ``b``: exact int32 products, then scales."""
    out = torch._int_mm(a, b).float() * scale_a.float() * scale_b.float()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def weight_only_supported(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                          scale_b: torch.Tensor, out_dtype: torch.dtype,
                          bias: torch.Tensor | None = None) -> str | None:
    """Why :func:`weight_only` declines a call, or None."""
    if b.dtype != torch.int8:
        return f"needs int8 weights, got {b.dtype}"
    if not b.t().is_contiguous():
        return "needs the weight [N, K] contiguous (b = weight.T)"
    if scale_a.numel() != 1:
        return "activations are not quantized: scale_a must be one value"
    return _scale_problem(scale_b, (1, b.shape[1]), "weight")


def weight_only(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The ``scaled_mm`` op for float ``a`` and int8 ``b`` with per-channel scales."""
    scales = scale_b.reshape(-1).expand(b.shape[1]).to(a.dtype)
    out = torch.ops.aten._weight_int8pack_mm(a, b.t(), scales)
    if scale_a.numel() == 1 and float(scale_a) != 1.0:
        out = out * scale_a.to(out.dtype)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.to(out_dtype)
