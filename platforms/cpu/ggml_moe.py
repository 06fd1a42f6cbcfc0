"""The CPU platform's ``ggml_moe_experts`` variants: GGUF experts kept in their blocks,
tokens grouped by expert, every active expert's rows through one build of the C
``ggml_linear`` kernel.

A call sorts the ``T * k`` (token, slot) pairs by expert once (``sort`` and
``unique_consecutive``: the active experts and their row counts, no loop over the
experts no token chose) and gathers each pair's token row into one buffer, so each
active expert's rows are one contiguous run. Then, with no torch op inside either loop:

1. each active expert's gate and up rows (llama.cpp's ``ffn_{gate,up}_exps``, stacked as
   one ``[E, 2I, row_bytes]``) in **one** kernel call on its run, written in place into
   one ``[T * k, 2I]`` buffer (the kernel quantizes the run's activations once for both);
2. the gated activation **once** over the whole buffer (``silu_and_mul`` /
   ``gelu_and_mul``), not once per expert;
3. each active expert's down rows in one kernel call, written in place into ``[T * k, H]``;
4. the rows scaled by their routing weights and summed per token (one ``index_add_``).

Each kernel call is :meth:`~.ggml.ops.GgmlKernels.linear` of the variant's build, called
unchecked (the stacks are checked once per call by :func:`experts_supported`; stacks of a
type the C kernel does not serve, such as F32 or F16, go through the ``ggml_linear`` op
instead), so it
rounds activations and picks the integer kernel or the tiles exactly as ``ggml_linear``
does for the same rows: an expert's outputs for a row are those of ``ggml_linear`` on
that row against the expert's rows. A decode step with top-8 makes 16 kernel calls per
layer and a handful of torch ops, whatever the expert count.
"""

from __future__ import annotations

import torch

from hwplug.kernel_registry.moe_compose import gated
from hwplug.kernel_registry.ops_ggml import ggml_linear
from hwplug.kernel_registry.reference.ggml import QUANTIZED_TYPES, row_values, type_name
from hwplug.platforms.cpu.ggml import ops as ggml
from hwplug.platforms.cpu.step_graph import native_call

__all__ = ["AVX2", "PORTABLE", "VNNI", "GroupedGgufExperts", "experts_supported"]


class GroupedGgufExperts:
    """The ``ggml_moe_experts`` op over one build (``kernels``) of the C GGUF kernel (see
    the module docstring); call it as the op."""

    def __init__(self, kernels: ggml.GgmlKernels) -> None:
        self.kernels = kernels

    def __call__(self, x: torch.Tensor, w13: torch.Tensor, w13_type: int, w2: torch.Tensor,
                 w2_type: int, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 activation: str = "silu") -> torch.Tensor:
        num_tokens, k = topk_ids.shape
        sorted_ids, order = topk_ids.reshape(-1).sort(stable=True)
        experts, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
        runs = list(zip(experts.tolist(), counts.tolist(), strict=True))
        token_of = order // k
        rows = x.to(torch.float32).index_select(0, token_of)
        hidden = gated(activation)(self._project(rows, w13, w13_type, runs)).contiguous()
        out_rows = self._project(hidden, w2, w2_type, runs)
        out_rows *= topk_weights.reshape(-1)[order].unsqueeze(1).to(torch.float32)
        out = torch.zeros((num_tokens, x.shape[1]), dtype=torch.float32)
        out.index_add_(0, token_of, out_rows)
        return out.to(x.dtype)

    def _project(self, rows: torch.Tensor, stack: torch.Tensor, ggml_type: int,
                 runs: list[tuple[int, int]]) -> torch.Tensor:
        """``[R, stack rows]``: each run ``(expert, count)`` of ``rows`` (contiguous fp32
        ``[R, K]``; consecutive runs covering them) times its expert's rows of ``stack``,
        one kernel call per run. Runs the integer kernel serves (below the tuning table's
        switch to the tiles: every run, for the K-quants) call the C function straight
        from pointers into the stacks and buffers (what ``linear`` would call, without
        its per-call Python); the others go through ``linear`` (or the ``ggml_linear`` op
        for types the C kernel does not serve)."""
        out = torch.empty((rows.shape[0], stack.shape[1]), dtype=torch.float32)
        threads = torch.get_num_threads()
        served = ggml_type in QUANTIZED_TYPES
        switch = ggml.tiled_from(threads)[ggml_type] if served else 0
        bits = ggml.ACTIVATIONS[ggml.activations_of(threads)[ggml_type]] if served else 0
        (n, row_bytes), k = stack.shape[1:], rows.shape[1]
        weights, rows_at, out_at = stack.data_ptr(), rows.data_ptr(), out.data_ptr()
        start = 0
        for expert, count in runs:
            stop = start + count
            if switch is not None and count >= switch:
                linear = self.kernels.linear.unchecked if served else ggml_linear
                linear(rows[start:stop], stack[expert], ggml_type, out=out[start:stop])
            else:  # GgmlKernels.linear_blocks' call, its checks made once per op call
                native_call(self.kernels.library.hwplug_ggml_linear, ggml_type,
                            weights + expert * stack.stride(0), row_bytes, n, k,
                            rows_at + start * k * 4, count, out_at + start * n * 4, n, None,
                            bits, threads, check=self.kernels._check)
            start = stop
        return out


def experts_supported(x: torch.Tensor, w13: torch.Tensor, w13_type: int, w2: torch.Tensor,
                      w2_type: int, *args: object, **kwargs: object) -> str | None:
    """Why :class:`GroupedGgufExperts` declines a call, or None: ``x`` 2-D, and ``w13`` /
    ``w2`` contiguous ``uint8 [E, rows, row_bytes]`` stacks whose experts'
    rows hold ``2I`` rows of ``H`` values and ``H`` rows of ``I`` values, which the C kernel
    takes where it serves their type."""
    if x.dim() != 2:
        return f"x must be 2-D [T, H], got {list(x.shape)}"
    for name, stack in (("w13", w13), ("w2", w2)):
        if stack.dim() != 3 or not stack.is_contiguous() or stack.shape[0] == 0:
            return (f"{name} must be a contiguous [E, rows, row_bytes] stack of E > 0 "
                    f"experts, got {list(stack.shape)}"
                    f"{'' if stack.is_contiguous() else ' non-contiguous'}")
    if w13.shape[0] != w2.shape[0] or w13.shape[1] % 2 or w2.shape[1] != x.shape[1]:
        return (f"w13 {list(w13.shape)} and w2 {list(w2.shape)} are not [E, 2I, .] and "
                f"[E, {x.shape[1]}, .] stacks of one expert count")
    intermediate = x.new_empty((0, w13.shape[1] // 2))
    for rows, stack, kind in ((x, w13, w13_type), (intermediate, w2, w2_type)):
        if kind in QUANTIZED_TYPES and (problem := ggml.linear_supported(rows, stack[0], kind)):
            return problem
        if kind not in QUANTIZED_TYPES and row_values(kind, stack.shape[2]) != rows.shape[1]:
            return (f"rows of {stack.shape[2]} bytes are not {rows.shape[1]} "
                    f"{type_name(kind)} values")
    return None


#: The variant over each build of the C kernel (see :mod:`.ggml.ops`).
VNNI = GroupedGgufExperts(ggml.VNNI)
AVX2 = GroupedGgufExperts(ggml.AVX2)
PORTABLE = GroupedGgufExperts(ggml.PORTABLE)
