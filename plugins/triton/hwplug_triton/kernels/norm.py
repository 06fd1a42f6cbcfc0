"""``rms_norm`` as one Triton program per row, optionally fused with the residual add.

Contract (the ``rms_norm`` op): ``x [..., H]``, ``weight [H]``; without ``residual``
returns ``x * rsqrt(mean(x**2, -1) + eps) * weight``; with ``residual`` (shape of ``x``)
returns ``(rms_norm(s), s)`` where ``s = x + residual`` rounded to ``x.dtype``. fp32
inside, outputs in ``x.dtype``, new contiguous tensors.

supports: any float dtype, hidden size ``H <= MAX_HIDDEN`` (one row lives in registers);
see :func:`supported`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwplug_triton.kernels import checked
from hwplug_triton.tuning import launch_config

#: Largest hidden size one program holds in registers.
MAX_HIDDEN = 65536


def supported(x: torch.Tensor, weight: torch.Tensor, eps: float,
              residual: torch.Tensor | None = None) -> str | None:
    """Why this kernel cannot serve the call, or None."""
    hidden = x.shape[-1]
    if hidden > MAX_HIDDEN:
        return f"hidden size {hidden} > {MAX_HIDDEN}"
    if weight.shape != (hidden,) or weight.stride(0) != 1:
        return f"weight must be contiguous of shape ({hidden},), got {tuple(weight.shape)}"
    if residual is not None and residual.shape != x.shape:
        return f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}"
    return None


@checked(supported)
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The ``rms_norm`` op (see the module docstring)."""
    hidden = x.shape[-1]
    rows = x.reshape(-1, hidden).contiguous()
    out = torch.empty_like(rows)
    # without a residual the kernel never touches these two; any tensor will do
    summed = torch.empty_like(rows) if residual is not None else out
    res_rows = residual.reshape(-1, hidden).contiguous() if residual is not None else rows
    if rows.shape[0]:
        config = launch_config("rms_norm", x.device, hidden)
        _rms_norm_kernel[(rows.shape[0],)](
            rows, res_rows, weight, out, summed, hidden, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(hidden),
            num_warps=config["num_warps"])
    if residual is None:
        return out.view(x.shape)
    return out.view(x.shape), summed.view(x.shape)


@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, summed_ptr, hidden, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * hidden
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(residual_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
        x = x.to(summed_ptr.dtype.element_ty)
        tl.store(summed_ptr + row + cols, x, mask=mask)
        x = x.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / hidden + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row + cols, (x * inv_rms * weight).to(out_ptr.dtype.element_ty),
             mask=mask)
