"""fp8 ``scaled_mm`` through ``torch._scaled_mm`` (cuBLASLt), for capability >= 8.9.

Importing this module does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def supported(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> str | None:
    """Why cuBLASLt cannot run this call, or None: K and N must be multiples of 16, the
    scales per-tensor (row-wise scales need capability 9.0; left to the reference), and at
    most one operand e5m2 (cuBLASLt has no e5m2 x e5m2 GEMM: an H100 raises)."""
    import torch

    if a.dtype == b.dtype == torch.float8_e5m2:
        return ("a and b both float8_e5m2: cuBLASLt takes e4m3 x e4m3, e4m3 x e5m2 and "
                "e5m2 x e4m3")
    if a.shape[1] % 16 or b.shape[1] % 16:
        return f"K={a.shape[1]} and N={b.shape[1]} must be multiples of 16"
    if scale_a.numel() != 1 or scale_b.numel() != 1:
        return "only per-tensor scales"
    return None


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The ``scaled_mm`` op contract; ``b`` is made column-major as cuBLASLt requires."""
    import torch

    b_col = b if b.stride(0) == 1 else b.t().contiguous().t()
    return torch._scaled_mm(a, b_col, scale_a=scale_a.float(), scale_b=scale_b.float(),
                            bias=bias, out_dtype=out_dtype)
