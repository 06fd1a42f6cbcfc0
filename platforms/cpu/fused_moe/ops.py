"""The mixture-of-experts ops in one C call each (``kernels.c`` beside this file), fp32:
``moe_topk`` (softmax scoring), ``moe_experts`` and ``ggml_moe_experts``; and what else a
MoE decode step needs to stay native: ``ggml_linear`` on GGUF F32 rows (the router,
:func:`f32_rows_linear`).

The routing stays in C memory: no expert id is read back into Python, and a call is the
output and scratch allocations plus one :func:`~hwplug.platforms.cpu.step_graph.
native_call`, so a decode step of a MoE model can be a step graph. :data:`AVX2` and
:data:`PORTABLE` are the builds of ``kernels.c`` (compiled by
:mod:`hwplug.platforms.cpu.ggml.build` when the registry binds a variant or by ``hwplug
build``); :data:`GGUF_VNNI`, :data:`GGUF_AVX2` and :data:`GGUF_PORTABLE` pair one with a
build of the GGUF kernel, whose ``hwplug_ggml_linear`` the C code calls through a
function pointer; their variants' native library is the pair (:class:`GgufMoeKernels`).
Each op checks its call first (the ``*_supported`` functions; the registry's variants name
the ``unchecked`` forms, having asked ``supports``).

Contracts beyond the ops': ``moe_topk`` picks the lower expert index on equal scores;
``moe_experts`` and ``ggml_moe_experts`` sum each token's slots in slot order, so a token's
output does not depend on the other tokens of the call. ``ggml_moe_experts`` serves up to
:data:`MAX_GGUF_TOKENS` tokens whose every expert run takes the GGUF kernel's integer dots
(the tuning table's switch to dequantized tiles lies above them).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.native import BuildStatus
from hwplug.kernel_registry.reference.ggml import QUANTIZED_TYPES, type_name
from hwplug.platforms.cpu import ggml_moe
from hwplug.platforms.cpu.checked_op import checked
from hwplug.platforms.cpu.fused import ops as fused
from hwplug.platforms.cpu.ggml import build
from hwplug.platforms.cpu.ggml import ops as ggml
from hwplug.platforms.cpu.step_graph import native_call

__all__ = ["AVX2", "GGUF_AVX2", "GGUF_PORTABLE", "GGUF_VNNI", "MAX_GGUF_TOKENS", "PORTABLE",
           "GgufMoeKernels", "MoeKernels", "f32_rows_linear", "f32_rows_supported"]

SOURCE = Path(__file__).with_name("kernels.c")
#: The most tokens a ``ggml_moe_experts`` call serves (decode batches and verify steps).
MAX_GGUF_TOKENS = 16
#: GGUF's F32 type.
F32_TYPE = 0
#: The gated activations, as the C code numbers them.
ACTIVATIONS = {"silu": 0, "gelu": 1}
_i64, _ptr, _int, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_SIGNATURES = {
    "hwplug_moe_topk_softmax": [_ptr, _i64, _i64, _i64, _i64, _int, _f32, _ptr, _ptr, _int],
    "hwplug_moe_experts_f32": [_ptr, _i64, _i64, _ptr, _ptr, _i64, _i64, _ptr, _ptr, _i64,
                               _int, _ptr, _ptr, _ptr, _ptr, _int],
    "hwplug_moe_experts_ggml": [_ptr, _ptr, _i64, _i64, _ptr, _int, _i64, _int, _ptr, _int,
                                _i64, _int, _i64, _i64, _ptr, _ptr, _i64, _int, _ptr, _ptr,
                                _ptr, _ptr, _ptr, _int],
}


def _failed(status: int) -> None:
    if status == -1:
        raise UnsupportedError("topk_ids holds an expert id outside [0, E)")
    if status == -2:
        raise MemoryError("the MoE kernel's scratch could not be allocated")
    raise UnsupportedError("hwplug_ggml_linear refused an expert's rows")


class MoeKernels(build.Library):
    """One build of ``kernels.c``; its methods are the ops (built by
    :meth:`~hwplug.platforms.cpu.ggml.build.Library.ensure_built` first)."""

    source = SOURCE
    signatures = _SIGNATURES

    @checked("topk_supported")
    def moe_topk(self, router_logits: torch.Tensor, top_k: int, renormalize: bool = True, *,
                 scoring: str = "softmax", correction_bias: torch.Tensor | None = None,
                 num_expert_group: int | None = None, topk_group: int | None = None,
                 routed_scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``moe_topk`` op on calls :func:`topk_supported` accepts."""
        tokens, experts = router_logits.shape
        weights = torch.empty((tokens, top_k), dtype=torch.float32)
        ids = torch.empty((tokens, top_k), dtype=torch.int64)
        native_call(self.library.hwplug_moe_topk_softmax, router_logits.data_ptr(),
                    router_logits.stride(0), tokens, experts, top_k, int(renormalize),
                    routed_scaling_factor, weights.data_ptr(), ids.data_ptr(),
                    torch.get_num_threads(), check=_failed)
        return weights, ids

    @checked("experts_supported")
    def moe_experts(self, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                    topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                    activation: str = "silu") -> torch.Tensor:
        """The fp32 ``moe_experts`` op on calls :func:`experts_supported` accepts."""
        (tokens, hidden), (experts, rows, _), k = x.shape, w13.shape, topk_ids.shape[1]
        pairs = tokens * k
        out = torch.empty((tokens, hidden), dtype=torch.float32)
        up = torch.empty((pairs, rows), dtype=torch.float32)
        act = torch.empty((pairs, rows // 2), dtype=torch.float32)
        down = torch.empty((pairs, hidden), dtype=torch.float32)
        native_call(self.library.hwplug_moe_experts_f32, x.data_ptr(), tokens, hidden,
                    w13.data_ptr(), w2.data_ptr(), experts, rows // 2, topk_weights.data_ptr(),
                    topk_ids.data_ptr(), k, ACTIVATIONS[activation], out.data_ptr(),
                    up.data_ptr(), act.data_ptr(), down.data_ptr(), torch.get_num_threads(),
                    check=_failed)
        return out


class GgufMoeKernels:
    """``ggml_moe_experts`` through a build of ``kernels.c`` (``moe``) calling a build of the
    GGUF kernel (``other``); the native library of its variants (the
    :class:`~hwplug.kernel_registry.native.NativeLibrary` protocol) is the two builds
    together (``parts``), so binding a variant builds and loads both."""

    def __init__(self, moe: MoeKernels, other: build.Library) -> None:
        self.moe, self.other = moe, other
        self.parts = (other, moe)
        self.name = f"{moe.name}+{other.source.parent.name} {other.name}"

    def status(self) -> BuildStatus:
        """The GGUF build's status unless it is built, else the MoE build's."""
        other = self.other.status()
        return other if other.state != "built" else self.moe.status()

    def ensure_built(self) -> BuildStatus:
        """Build and load the GGUF build, then the MoE build (whose status is returned)."""
        self.other.ensure_built()
        return self.moe.ensure_built()

    def forget_failure(self) -> bool:
        """Forget either build's remembered failure; whether there was one."""
        return self.other.forget_failure() | self.moe.forget_failure()

    @functools.cached_property
    def _linear(self) -> int:
        """The address of the GGUF build's ``hwplug_ggml_linear``."""
        return ctypes.cast(self.other.library.hwplug_ggml_linear, ctypes.c_void_p).value

    @checked("gguf_experts_supported")
    def experts(self, x: torch.Tensor, w13: torch.Tensor, w13_type: int, w2: torch.Tensor,
                w2_type: int, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                activation: str = "silu") -> torch.Tensor:
        """The ``ggml_moe_experts`` op on calls :func:`gguf_experts_supported` accepts."""
        (tokens, hidden), (experts, rows, bytes13), k = x.shape, w13.shape, topk_ids.shape[1]
        pairs, threads = tokens * k, torch.get_num_threads()
        bits = ggml.activations_of(threads)
        out = torch.empty((tokens, hidden), dtype=torch.float32)
        gathered = torch.empty((pairs, hidden), dtype=torch.float32)
        up = torch.empty((pairs, rows), dtype=torch.float32)
        act = torch.empty((pairs, rows // 2), dtype=torch.float32)
        down = torch.empty((pairs, hidden), dtype=torch.float32)
        native_call(self.moe.library.hwplug_moe_experts_ggml, self._linear, x.data_ptr(), tokens,
                    hidden, w13.data_ptr(), w13_type, bytes13, ggml.ACTIVATIONS[bits[w13_type]],
                    w2.data_ptr(), w2_type, w2.shape[2], ggml.ACTIVATIONS[bits[w2_type]],
                    experts, rows // 2, topk_weights.data_ptr(), topk_ids.data_ptr(), k,
                    ACTIVATIONS[activation], out.data_ptr(), gathered.data_ptr(), up.data_ptr(),
                    act.data_ptr(), down.data_ptr(), threads, check=_failed)
        return out


def _routing_problem(topk_weights: torch.Tensor, topk_ids: torch.Tensor, tokens: int
                     ) -> str | None:
    """Why ``(topk_weights, topk_ids)`` are not contiguous fp32 / int64 ``[tokens, k]``."""
    if topk_weights.dtype != torch.float32 or topk_ids.dtype != torch.int64 or \
            not topk_weights.is_contiguous() or not topk_ids.is_contiguous() or \
            topk_ids.dim() != 2 or topk_ids.shape != topk_weights.shape or \
            topk_ids.shape[0] != tokens:
        return (f"needs contiguous topk_weights float32 and topk_ids int64, both [{tokens}, k], "
                f"got {topk_weights.dtype} {list(topk_weights.shape)} and {topk_ids.dtype} "
                f"{list(topk_ids.shape)}")
    return None


def topk_supported(router_logits: torch.Tensor, top_k: int, renormalize: bool = True, *,
                   scoring: str = "softmax", correction_bias: torch.Tensor | None = None,
                   num_expert_group: int | None = None, topk_group: int | None = None,
                   routed_scaling_factor: float = 1.0) -> str | None:
    """Why the C ``moe_topk`` declines a call, or None: softmax scoring without a correction
    bias or grouped top-k (the reference serves those), fp32 logits with contiguous rows."""
    if scoring != "softmax" or correction_bias is not None or num_expert_group is not None:
        return (f"softmax scoring only, without correction_bias or grouped top-k; got scoring "
                f"{scoring!r}{', a correction_bias' if correction_bias is not None else ''}"
                f"{', grouped top-k' if num_expert_group is not None else ''}")
    if router_logits.dtype != torch.float32 or router_logits.dim() != 2 or \
            router_logits.stride(1) != 1:
        return (f"needs float32 router_logits [T, E] with contiguous rows, got "
                f"{router_logits.dtype} {list(router_logits.shape)}")
    if not 0 < top_k <= router_logits.shape[1]:
        return f"top_k {top_k} must lie in [1, {router_logits.shape[1]}] (the experts)"
    return None


def experts_supported(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                      topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                      activation: str = "silu") -> str | None:
    """Why the C ``moe_experts`` declines a call, or None: contiguous fp32 ``x [T, H]``,
    ``w13 [E, 2I, H]``, ``w2 [E, H, I]``, routing as :func:`_routing_problem` wants it."""
    if activation not in ACTIVATIONS:
        return f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}"
    for name, tensor, dims in (("x", x, 2), ("w13", w13, 3), ("w2", w2, 3)):
        if tensor.dtype != torch.float32 or tensor.dim() != dims or not tensor.is_contiguous():
            return (f"{name}: contiguous float32 of {dims} dimensions only, got {tensor.dtype} "
                    f"{list(tensor.shape)}{'' if tensor.is_contiguous() else ' non-contiguous'}")
    experts, rows, hidden = w13.shape
    if hidden != x.shape[1] or rows % 2 or tuple(w2.shape) != (experts, hidden, rows // 2):
        return (f"w13 {list(w13.shape)} and w2 {list(w2.shape)} do not fit x {list(x.shape)} "
                f"as [E, 2I, H] and [E, H, I]")
    return _routing_problem(topk_weights, topk_ids, x.shape[0])


def gguf_experts_supported(x: torch.Tensor, w13: torch.Tensor, w13_type: int,
                           w2: torch.Tensor, w2_type: int, topk_weights: torch.Tensor,
                           topk_ids: torch.Tensor, activation: str = "silu") -> str | None:
    """Why the C ``ggml_moe_experts`` declines a call, or None: contiguous fp32 ``x`` of up
    to :data:`MAX_GGUF_TOKENS` tokens, stacks :func:`.ggml_moe.experts_supported` accepts of
    types the GGUF kernel serves with its integer dots at that many rows."""
    if activation not in ACTIVATIONS:
        return f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}"
    if x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous() or \
            not 0 < x.shape[0] <= MAX_GGUF_TOKENS:
        return (f"needs contiguous float32 x [T, H] of 1 to {MAX_GGUF_TOKENS} tokens, got "
                f"{x.dtype} {list(x.shape)}")
    if problem := ggml_moe.experts_supported(x, w13, w13_type, w2, w2_type):
        return problem
    switch = ggml.tiled_from(torch.get_num_threads())
    for kind in (w13_type, w2_type):
        if kind not in QUANTIZED_TYPES or (switch[kind] is not None
                                           and switch[kind] <= x.shape[0]):
            return (f"{type_name(kind)} rows of {x.shape[0]} tokens do not take the GGUF "
                    f"kernel's integer dots (a type it serves, below its switch to tiles)")
    return _routing_problem(topk_weights, topk_ids, x.shape[0])


def f32_rows_linear(x: torch.Tensor, qweight: torch.Tensor, ggml_type: int,
                    bias: torch.Tensor | None = None, out: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """The ``ggml_linear`` op on GGUF F32 rows (llama.cpp keeps a MoE router,
    ``ffn_gate_inp``, in F32), for calls :func:`f32_rows_supported` accepts: the fp32 C
    ``linear`` (AVX2 build) on the rows viewed as floats, so the router of a GGUF MoE
    decode step is a native call, not a torch matmul."""
    return fused.AVX2.linear.unchecked(x, qweight.view(torch.float32), bias)


def f32_rows_supported(x: torch.Tensor, qweight: torch.Tensor, ggml_type: int,
                       bias: torch.Tensor | None = None, out: torch.Tensor | None = None
                       ) -> str | None:
    """Why :func:`f32_rows_linear` declines a call, or None: F32 rows of ``x``'s ``K``
    values (contiguous ``uint8 [N, 4K]``, 4-byte aligned), no ``out``, and what the fp32 C
    ``linear`` takes."""
    if ggml_type != F32_TYPE or out is not None:
        return (f"GGUF F32 rows without out= only, got {type_name(ggml_type)}"
                f"{', out=' if out is not None else ''}")
    if qweight.dtype != torch.uint8 or qweight.dim() != 2 or not qweight.is_contiguous() or \
            qweight.shape[1] != 4 * x.shape[-1] or qweight.data_ptr() % 4:
        return (f"needs contiguous, 4-byte aligned uint8 [N, {4 * x.shape[-1]}] F32 rows, got "
                f"{qweight.dtype} {list(qweight.shape)}")
    return fused.linear_supported(x, qweight.view(torch.float32), bias)


#: The builds of ``kernels.c``.
AVX2 = MoeKernels("avx2")
PORTABLE = MoeKernels("portable")
#: ``ggml_moe_experts`` over each build of the GGUF kernel.
GGUF_VNNI = GgufMoeKernels(AVX2, ggml.VNNI)
GGUF_AVX2 = GgufMoeKernels(AVX2, ggml.AVX2)
GGUF_PORTABLE = GgufMoeKernels(PORTABLE, ggml.PORTABLE)
