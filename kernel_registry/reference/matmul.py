"""Matrix multiplies: the dense ``linear`` of every unquantized layer, the scaled GEMM
that fp8 (and other low-precision) weights use, and the unquantized table's ``embedding``
(the lookup a one-hot matrix multiply would be)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hwplug.errors import UnsupportedError


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Rows ``ids [T]`` of ``weight [V, H]`` -> ``[T, H]`` in ``weight.dtype``, through
    ``F.embedding``."""
    return F.embedding(ids, weight)


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

    ``a [M, K]`` and ``b [K, N]`` may be float (fp8 e4m3/e5m2, or a float activation with
    int8 weights) or int8. Each scale broadcasts over its operand block by block: ``scale_a``
    is a scalar, ``[M, 1]`` (per token) or ``[M, K / g]`` (per token group of ``g``
    inputs); ``scale_b`` a scalar, ``[1, N]`` (per channel) or ``[K / bk, N / bn]`` (per
    ``bk x bn`` block); both fp32; group and block sizes divide ``K`` and ``N``. ``bias`` is
    ``[N]`` or None. Returns ``[M, N]`` in ``out_dtype``.
    """
    out = (a.float() * expand_scale(scale_a, a.shape)) @ (b.float()
                                                         * expand_scale(scale_b, b.shape))
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def expand_scale(scale: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``scale`` (scalar, or one entry per equal block of a 2-D ``shape``) repeated to
    ``shape``'s size along every dimension it has fewer entries than; a dimension of 1
    broadcasts as usual. Raises :class:`UnsupportedError` when the entries do not divide
    the dimension evenly."""
    scale = scale.float()
    if scale.dim() == 0:
        return scale
    for dim, (entries, size) in enumerate(zip(scale.shape, shape, strict=True)):
        if entries not in (1, size):
            if size % entries:
                raise UnsupportedError(f"{entries} scales do not split dimension {dim} of "
                                       f"size {size} into equal blocks")
            scale = scale.repeat_interleave(size // entries, dim=dim)
    return scale
