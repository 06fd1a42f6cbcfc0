"""``int4_linear`` through torch's KleidiAI int4 GEMMs.

``torch.ops.aten._dyn_quant_pack_4bit_weight`` packs an int4 weight (the op's layout:
``uint8 [N, K / 2]``, low nibble first, offset 8), its scales and bias into one buffer in
the order KleidiAI's micro-kernels read; ``torch.ops.aten._dyn_quant_matmul_4bit``
quantizes each activation row to int8 and multiplies. On an Arm torch build with
KleidiAI and cores with dotprod, those are KleidiAI's NEON dotprod / i8mm kernels
(torch picks i8mm where the cores have it); elsewhere torch runs a portable C++ loop with
the same results, measured 12-75x slower than dense fp32 ``F.linear`` on a 2-core x86
EPYC at SmolLM2's shapes (``benchmarks/int4_linear.py``), which is why the variants are
registered for ``cpu-arm`` only.

The packed buffer is built once per weight, on its first call (weakly cached: it goes
when the weight goes; rebuilt when the weight or its scales are written, as their version
counters show). KleidiAI's group-wise kernels take bfloat16 scales and its per-row kernels
float32 ones (torch's rule; other scale dtypes silently select the portable loop), so
group-wise scales are rounded to bfloat16 when packed. Bias is added after the GEMM
rather than packed, so every torch version and both code paths treat it the same.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from hwplug.kernel_registry.reference.int4 import group_size

#: KleidiAI's group-wise kernels take groups that are multiples of this many inputs.
GROUP_MULTIPLE = 32
#: qweight -> (qweight version, scales, scales version, the packed buffer).
_packed: WeakTensorKeyDictionary = WeakTensorKeyDictionary()


def int4_linear_supported(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                          bias: torch.Tensor | None = None) -> str | None:
    """Why :func:`int4_linear` declines a call (the reference serves it then), or None:
    groups must be whole rows or multiples of 32 inputs; bfloat16 activations need one
    scale per row (torch has no group-wise bf16 path)."""
    in_features = x.shape[-1]
    try:
        group = group_size(in_features, scales)
    except ValueError as exc:
        return str(exc)
    if group != in_features and group % GROUP_MULTIPLE:
        return f"group size {group} is neither the row ({in_features}) nor a multiple of " \
               f"{GROUP_MULTIPLE}"
    if x.dtype == torch.bfloat16 and group != in_features:
        return f"bfloat16 activations need one scale per row, got groups of {group}"
    return None


def packed_weight(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The KleidiAI buffer of ``qweight`` and ``scales``, packed on first use and after
    either is written."""
    entry = _packed.get(qweight)
    if (entry is None or entry[0] != qweight._version or entry[1] is not scales
            or entry[2] != scales._version):
        out_features, in_features = qweight.shape[0], qweight.shape[1] * 2
        group = group_size(in_features, scales)
        scale_dtype = torch.float32 if group == in_features else torch.bfloat16
        buffer = torch.ops.aten._dyn_quant_pack_4bit_weight(
            qweight.detach().contiguous(), scales.detach().to(scale_dtype).contiguous(), None,
            group, in_features, out_features)
        entry = (qweight._version, scales, scales._version, buffer)
        _packed[qweight] = entry
    return entry[3]


def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """The ``int4_linear`` op through ``_dyn_quant_matmul_4bit`` (see the module docstring)."""
    out_features, in_features = qweight.shape[0], x.shape[-1]
    rows = x.reshape(-1, in_features).contiguous()
    out = torch.ops.aten._dyn_quant_matmul_4bit(
        rows, packed_weight(qweight, scales), group_size(in_features, scales), in_features,
        out_features)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.to(x.dtype).view(*x.shape[:-1], out_features)
