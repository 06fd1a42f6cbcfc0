"""RMS normalisation, optionally fused with the residual add."""

from __future__ import annotations

import torch


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Root-mean-square normalise ``x [..., H]`` over its last dimension and scale by ``weight [H]``.

    Without ``residual`` returns ``x * rsqrt(mean(x**2, -1) + eps) * weight``. With
    ``residual`` (same shape as ``x``) it first forms ``s = x + residual`` in ``x.dtype`` and
    returns ``(rms_norm(s), s)``, so the caller can carry ``s`` as the next residual.
    Computed in fp32; outputs have ``x.dtype``.
    """
    if residual is not None:
        summed = (x + residual).to(x.dtype)
        return _normalize(summed, weight, eps), summed
    return _normalize(x, weight, eps)


def _normalize(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    inv_rms = torch.rsqrt(x32.square().mean(dim=-1, keepdim=True) + eps)
    return (x32 * inv_rms * weight.float()).to(x.dtype)
