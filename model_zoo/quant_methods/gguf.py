"""``GgufMethod`` (``"gguf"``): the weights of a GGUF file, kept as the file stores them.

Every matrix of a GGUF checkpoint is ``qweight`` (``uint8 [N, row_bytes]``, each row the
tensor's GGUF blocks) with ``qweight_type`` (its ``gguf.GGMLQuantizationType`` value), the
layout of the registry's ``ggml_linear`` and ``ggml_embedding`` ops (see
:mod:`hwplug.kernel_registry.ops_ggml`); the GGUF loader writes checkpoints in that form.
Rows are independent, so a fused layer (q/k/v, gate/up) is the rows of its shards, kept
as runs: shards of one type the file (or the conversion's ``repacked.bin``) stores side by
side are one run, a view spanning them; every other shard is a run of its own (a Q4_K_M
file keeps ``attn_v`` in Q6_K, and stores ``ffn_norm`` between ``ffn_gate`` and
``ffn_up``). Each run is one ``ggml_linear`` call writing its columns of the layer's one
output (the op's ``out``), so a step of C kernels stays native calls only (a step graph),
and each output row is what its own row's dot products give, whichever run holds it. The
embedding and LM head tables are stored the same way (:attr:`quantizes_vocab`): the
embedding dequantizes only the rows it reads.

After loading, ``layer.gguf_runs`` are the runs, ``(type, uint8 [rows, row_bytes])``: the
checkpoint's tensors themselves (or a view spanning adjacent ones), so blocks the loader
handed out as views of the mapped ``.gguf`` (:mod:`hwplug.model_zoo.loaders.mapped`) stay
the file's pages, resident once, and a cached load reads no weight byte before the first
step. One exception: consecutive runs of one type that are not repacked (below) but
stored apart, as llama's Q/K rows (reordered on conversion) and V are, are copied once
into one run (``layer.gguf_joined`` lists them) and the pages they were read from
released: one kernel call instead of three made SmolLM2's batch-8 decode 5-7% faster
(batch 1: within noise), and a Qwen2.5-1.5B Q8_0's gate and up rows in one run decode
1.17x faster than in two. Where the shards are views of one mapped file, the joined run is
kept in the repacked-weights cache and later loads map it instead of copying. The runs are
registered as the layer's buffers ``gguf_run0``, ``gguf_run1``... (not saved in a state
dict), and the loading parameters ``qweight`` / ``qweight_type`` are removed.

Where the model's kernel plan binds a variant other than the reference for
``ggml_linear_repacked`` (the cpu platform's VNNI build), each Q4_K / Q5_K / Q6_K / IQ4_XS
run of a layer that is not an embedding table (or is one that the tied LM head multiplies
by, ``serves_head``, where a native ``ggml_embedding_repacked`` then looks its rows up in the
repacked layout: one copy, the head's) is repacked once after loading (the
``ggml_repack`` op: groups of 16 rows with their 32-bit words interleaved, the same size; see
:mod:`hwplug.kernel_registry.reference.ggml_repack`) into one new buffer, multiplied by
``ggml_linear_repacked`` (bitwise ``ggml_linear``'s outputs on the rows), and the mapped
file's pages it read are released (:func:`~hwplug.model_zoo.loaders.mapped.release_pages`),
so the weights stay resident once. As :func:`~hwplug.model_zoo.context.build_model` loads,
the repacked runs are cached on disk and later loads map them from there, neither
repacking nor reading those runs of the file (:mod:`~hwplug.model_zoo.loaders.repacked_cache`).
``layer.gguf_repacked`` are the indices of those runs (``gguf_runs`` then holds the
repacked bytes); other types stay as rows.
``HWPLUG_DISABLED_KERNELS=ggml_linear_repacked/ggml_vnni`` keeps every run as rows,
``ggml_embedding_repacked/ggml_vnni`` the tied table. Qwen2.5-1.5B's tied 151936 x 1536
Q6_K head took 52 against 59 ms repacked at 32 rows, 17.6 against 25.0 at 8, 8.2 against
7.6 at one (a 32-id lookup 40 against 24 µs); its Q4_K_M decode step (three interleaved
runs of benchmarks/decode_cpu_time.py, lowest) 280 against 304 ms at batch 32 (the runs
spread 280-349), 94 against 103 at 8 (one thread, CPU time, a loaded 2-vCPU Zen 5:
indicative).

Under tensor parallelism the blocks stay as stored (a rank's cut is repacked the same way). A column-parallel layer (and a
vocabulary table) holds its share of the output rows. A row-parallel layer holds its share
of the input columns where every run's blocks start and end on the share's boundaries
(``split_by="columns"``: the bytes of those blocks of each row); where a type's block does
not divide the share (Q4_K's 256 values over a 384-column share), it holds its share of the
output rows over every input column instead (``split_by="gathered"``): it gathers the input
from every rank, computes its rows and returns them in place in an otherwise zero output,
so the row-parallel all-reduce still sums the ranks' outputs into the whole.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import nn

from hwplug.dtypes import dtype_name
from hwplug.errors import ModelError, UnsupportedError
from hwplug.kernel_registry import kernels
from hwplug.kernel_registry.reference.ggml import dequantize, row_values, type_name
from hwplug.kernel_registry.reference.ggml_repack import REPACKED_TYPES, unpack
from hwplug.model_zoo.kernel_binding import kernels_of
from hwplug.model_zoo.loaders.mapped import release_pages
from hwplug.model_zoo.loaders.repacked_cache import joined_rows, repacked
from hwplug.quantization import QuantMethod

if TYPE_CHECKING:
    from hwplug.attention import KernelBinder
    from hwplug.model_zoo.parallel import TensorParallel

#: A layer's loaded parts: first output row -> {"qweight": rows, "qweight_type": type}.
Parts = dict[int, dict[str, Any]]

logger = logging.getLogger(__name__)


class GgufMethod(QuantMethod):
    """GGUF blocks as stored (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    IQ4_NL, IQ4_XS; F32, F16 and BF16 matrices too), multiplied by the ``ggml_linear`` op
    (looked up by ``ggml_embedding``)."""

    gemm_op: ClassVar[str] = "ggml_linear"
    embed_op: ClassVar[str] = "ggml_embedding"
    quantizes_vocab: ClassVar[bool] = True

    @classmethod
    def get_name(cls) -> str:
        return "gguf"

    def describe(self) -> str:
        return "gguf (weights in the file's GGUF blocks)"

    def create_weights(self, layer: nn.Module, input_size: int, output_size: int,
                       params_dtype: torch.dtype, bias: bool) -> None:
        parallel: TensorParallel | None = getattr(layer, "tp", None)
        layer.gguf_columns = None
        if parallel is not None and parallel.size > 1 and getattr(layer, "parallel", None) == "row":
            # load whole rows: process_weights_after_loading cuts them where the blocks allow
            _, first, count, full = layer.source
            layer.gguf_columns, layer.source = (first, count, full), None
        parts: Parts = {}
        layer.gguf_parts, layer.gguf_shape = parts, (output_size, input_size)
        for name, dtype in (("qweight", torch.uint8), ("qweight_type", torch.int32)):
            param = nn.Parameter(torch.empty(0, dtype=dtype), requires_grad=False)
            param.weight_loader = partial(_keep_part, parts, name)
            layer.register_parameter(name, param)
        layer.register_parameter("bias", nn.Parameter(
            torch.empty(output_size, dtype=params_dtype), requires_grad=False) if bias else None)
        plan, dtype = kernels_of(layer), dtype_name(params_dtype)
        layer.gemm_kernel = plan.bind("ggml_linear", dtype)
        layer.gguf_repacking = _repacking(plan, dtype)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Check the loaded parts cover every output row with whole rows of
        ``input_size`` values, then keep them as runs: each part itself, or one view of
        parts of one type adjacent in memory (a row-parallel layer's share is first cut
        from the whole rows), or one copy of consecutive parts of one type stored apart that
        are not repacked; then repack the Q4_K / Q5_K / Q6_K / IQ4_XS runs where the plan
        has a native ``ggml_linear_repacked`` (see the module docstring)."""
        layer.gguf_split_by = None
        if layer.gguf_columns is not None:
            _cut_share(layer)
        output_size, input_size = layer.gguf_shape
        runs: list[tuple[int, torch.Tensor]] = []
        expected = 0
        for first, part in sorted(layer.gguf_parts.items()):
            rows, kind = part.get("qweight"), part.get("qweight_type")
            if first != expected or rows is None or kind is None:
                raise ModelError(f"GGUF weights of a layer with {output_size} output rows "
                                 f"are missing rows from {expected} (or their type)")
            if row_values(kind, rows.shape[1]) != input_size:
                raise ModelError(f"a {type_name(kind)} row of {rows.shape[1]} bytes holds "
                                 f"{row_values(kind, rows.shape[1])} values; the layer has "
                                 f"{input_size} inputs")
            joined = _adjacent_view(runs[-1][1], rows) if runs and runs[-1][0] == kind else None
            if joined is None:
                runs.append((kind, rows))
            else:
                runs[-1] = (kind, joined)
            expected = first + rows.shape[0]
        if expected != output_size:
            raise ModelError(f"GGUF weights cover {expected} of {output_size} output rows")
        del layer.qweight, layer.qweight_type, layer.gguf_parts
        runs, layer.gguf_joined = _joined(runs, layer.gguf_repacking is not None)
        calls = _repack_runs(layer, runs)
        for index, (_, rows) in enumerate(runs):
            layer.register_buffer(f"gguf_run{index}", rows, persistent=False)
        layer.gguf_runs, layer.gguf_kernels = tuple(runs), tuple(calls)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if layer.gguf_split_by == "gathered":
            return _gathered_apply(layer, x)
        runs = layer.gguf_runs
        if len(runs) == 1:
            return layer.gguf_kernels[0](x, runs[0][1], runs[0][0], layer.bias)
        out = x.new_empty(*x.shape[:-1], layer.gguf_shape[0])
        _write_runs(layer, x, out, 0, layer.bias)
        return out

    def embed(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        (kind, rows), = layer.gguf_runs  # one checkpoint tensor: one type
        return layer.embed_kernel(ids, rows, kind)

    def dequantize(self, layer: nn.Module) -> torch.Tensor:
        return torch.cat([dequantize(rows, kind) for kind, rows in gguf_rows(layer)])

    def example_checkpoint(self, input_size: int, output_size: int,
                           generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Random rows of a quantized type whose blocks fit ``input_size`` values (drawn
        with ``generator``)."""
        from hwplug.kernel_registry.reference.ggml_weights import (
            GGML_TYPES,
            ggml_block,
            ggml_weight,
        )

        fitting = [kind for kind in GGML_TYPES if input_size % ggml_block(kind) == 0]
        if not fitting:
            raise UnsupportedError(f"GGUF rows are whole blocks of 32 or 256 values; "
                                   f"{input_size} inputs are not")
        kind = fitting[int(torch.randint(len(fitting), (), generator=generator))]
        return {"qweight": ggml_weight(generator, kind, output_size, input_size),
                "qweight_type": torch.tensor([kind], dtype=torch.int32)}


def gguf_rows(layer: nn.Module) -> list[tuple[int, torch.Tensor]]:
    """``layer``'s runs as GGUF rows, ``(type, uint8 [rows, row_bytes])``: the repacked
    ones un-interleaved into new tensors, the others themselves."""
    return [(kind, unpack(rows, kind) if index in layer.gguf_repacked else rows)
            for index, (kind, rows) in enumerate(layer.gguf_runs)]


def _repack_runs(layer: nn.Module, runs: list[tuple[int, torch.Tensor]]
                 ) -> list[Callable[..., Any]]:
    """Repack ``runs``' Q4_K / Q5_K / Q6_K / IQ4_XS runs in place where
    ``layer.gguf_repacking`` is set and the layer is no embedding table, or one that is
    also the LM head with a native :func:`_repacked_lookup` (which then becomes its
    ``embed_kernel``), releasing the mapped pages each one read (sets
    ``layer.gguf_repacked``); the kernel of each run. Where the reference served a repack
    (the native library failed to build), nothing more is repacked: its repacked linear
    would be the reference too, slower than the rows' kernel."""
    calls = [layer.gemm_kernel] * len(runs)
    repacking, layer.gguf_repacked = layer.gguf_repacking, frozenset()
    del layer.gguf_repacking
    lookup = _repacked_lookup(layer) if hasattr(layer, "embed_kernel") else None
    if repacking is None or (hasattr(layer, "embed_kernel") and lookup is None):
        return calls
    repack, kernel = repacking
    done = set()
    for index, (kind, rows) in enumerate(runs):
        if kind not in REPACKED_TYPES or kernels.REFERENCE in repack.used():
            continue
        packed = repacked(repack, rows, kind)  # from the cache where an earlier load wrote it
        if kernels.REFERENCE in repack.used():
            logger.warning("GGUF %s weights stay as rows: ggml_repack fell back to its "
                           "reference", type_name(kind))
            continue
        runs[index], calls[index] = (kind, packed), kernel
        done.add(index)
        release_pages(rows)
    layer.gguf_repacked = frozenset(done)
    if done and lookup is not None:
        layer.embed_kernel = lookup  # the table's one run, repacked: looked up there
    return calls


def _repacked_lookup(layer: nn.Module) -> Callable[..., Any] | None:
    """``ggml_embedding_repacked`` bound from ``layer``'s plan where ``layer`` is an
    embedding table that also serves as the LM head (``serves_head``, a tied model) and a
    variant other than the reference serves it (the reference un-interleaves the whole
    table at every lookup); else None: such a table stays as rows."""
    if not getattr(layer, "serves_head", False):
        return None
    lookup = kernels_of(layer).bind("ggml_embedding_repacked", "int64")
    chosen = getattr(lookup, "chosen", None)
    return None if chosen is None or kernels.REFERENCE in chosen() else lookup


def _repacking(plan: KernelBinder, dtype: str) -> tuple[Callable[..., Any], ...] | None:
    """``(ggml_repack, ggml_linear_repacked)`` bound from ``plan`` for ``dtype`` where a
    variant other than the reference serves ``ggml_linear_repacked`` (the reference
    un-interleaves the weight at every call: the rows serve faster); else None."""
    linear = plan.bind("ggml_linear_repacked", dtype)
    chosen = getattr(linear, "chosen", None)  # a BoundOp's; a plain binder's ops say nothing
    if chosen is None or kernels.REFERENCE in chosen():
        return None
    return plan.bind("ggml_repack", "uint8"), linear


def _cut_share(layer: nn.Module) -> None:
    """Cut a row-parallel layer's whole loaded rows (``layer.gguf_parts``) down to this
    rank's share: the share's input columns of every row when every part's blocks fall on
    its boundaries, else every column of this rank's share of the output rows
    (``layer.gguf_split_by`` says which, ``layer.gguf_shape`` what is kept)."""
    first, count, full = layer.gguf_columns
    output_size = layer.gguf_shape[0]
    parts = layer.gguf_parts
    kinds = {int(part["qweight_type"]) for part in parts.values() if "qweight_type" in part}
    blocks = {kind: GGML_QUANT_SIZES[GGMLQuantizationType(kind)] for kind in kinds}
    if all(first % values == 0 and count % values == 0 for values, _ in blocks.values()):
        for part in parts.values():
            values, size = blocks[part["qweight_type"]]
            start, stop = first // values * size, (first + count) // values * size
            part["qweight"] = part["qweight"][:, start:stop].contiguous()
        layer.gguf_split_by = "columns"
        return
    start, rows = layer.tp.share(output_size, "output rows")
    kept: Parts = {}
    for at, part in sorted(parts.items()):
        qweight = part["qweight"]
        lo, hi = max(at, start), min(at + qweight.shape[0], start + rows)
        if lo < hi:
            kept[lo - start] = {**part, "qweight": qweight[lo - at:hi - at].contiguous()}
    layer.gguf_parts, layer.gguf_shape = kept, (rows, full)
    layer.gguf_rows, layer.gguf_split_by = (start, rows), "gathered"
    logger.info("a row-parallel GGUF layer of %s blocks cannot split %d input columns at "
                "%d..%d: it gathers its input and computes its %d of %d output rows",
                "/".join(type_name(kind) for kind in sorted(kinds)), full, first,
                first + count, rows, output_size)


def _gathered_apply(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A ``gathered`` row-parallel layer: this rank's output rows of the whole input, in
    place in a zero output of every row (the bias, on rank 0 only, added whole), for the
    layer's all-reduce to sum."""
    whole = layer.tp.all_gather(x, dim=-1)
    out = whole.new_zeros(*x.shape[:-1], layer.output_size)
    _write_runs(layer, whole, out, layer.gguf_rows[0], None)
    return out if layer.bias is None else out + layer.bias.to(out.dtype)


def _write_runs(layer: nn.Module, x: torch.Tensor, out: torch.Tensor, first: int,
                bias: torch.Tensor | None) -> None:
    """Each of ``layer``'s runs multiplies ``x`` into its columns of ``out``, the first
    run's at column ``first`` (no ``torch.cat``: on the CPU the step stays native calls),
    adding its slice of ``bias``."""
    for (kind, rows), kernel in zip(layer.gguf_runs, layer.gguf_kernels, strict=True):
        stop = first + rows.shape[0]
        kernel(x, rows, kind, None if bias is None else bias[first:stop],
                          out=out[..., first:stop])
        first = stop


def _joined(runs: list[tuple[int, torch.Tensor]], repacking: bool
            ) -> tuple[list[tuple[int, torch.Tensor]], frozenset[int]]:
    """``runs`` with each stretch of consecutive runs of one type that stays as rows (not
    a type ``repacking`` repacks) copied into one tensor, the mapped pages the copied runs
    were read from released (resident once, but for a page at an end that a shard shares
    with its neighbour in the file); and the indices of the joined runs. A layer
    whose file stores its shards apart (llama's q/k/v) then makes one ``ggml_linear``
    call, not one per shard."""
    stretches: list[tuple[int, list[torch.Tensor]]] = []
    for kind, rows in runs:
        if stretches and stretches[-1][0] == kind and not (repacking and
                                                           kind in REPACKED_TYPES):
            stretches[-1][1].append(rows)
        else:
            stretches.append((kind, [rows]))
    kept: list[tuple[int, torch.Tensor]] = []
    joined: set[int] = set()
    for kind, parts in stretches:
        if len(parts) > 1:
            joined.add(len(kept))
            kept.append((kind, joined_rows(parts, kind)))  # from the cache after the first load
            for part in parts:
                release_pages(part)
        else:
            kept.append((kind, parts[0]))
    return kept, frozenset(joined)


def _adjacent_view(head: torch.Tensor, tail: torch.Tensor) -> torch.Tensor | None:
    """One view of GGUF rows ``head`` then ``tail`` when both are contiguous rows of one
    size and ``tail`` starts where ``head`` ends in the same storage; else None."""
    if (head.shape[1] != tail.shape[1] or not head.is_contiguous()
            or not tail.is_contiguous()
            or head.untyped_storage().data_ptr() != tail.untyped_storage().data_ptr()
            or tail.storage_offset() != head.storage_offset() + head.numel()):
        return None
    return head.as_strided((head.shape[0] + tail.shape[0], head.shape[1]), head.stride())


def _keep_part(parts: Parts, name: str, param: nn.Parameter, tensor: torch.Tensor,
               rows: tuple[int, int]) -> None:
    """The ``weight_loader`` of ``qweight`` / ``qweight_type``: keep ``tensor`` (itself,
    not a copy, when it is contiguous) for output rows ``rows`` until
    :meth:`GgufMethod.process_weights_after_loading`."""
    first, count = rows
    if name == "qweight":
        if tensor.dtype != torch.uint8 or tensor.dim() != 2 or tensor.shape[0] != count:
            raise ModelError(f"qweight must be uint8 [{count}, row_bytes] GGUF rows, got "
                             f"{str(tensor.dtype).removeprefix('torch.')} "
                             f"{list(tensor.shape)}")
        parts.setdefault(first, {})[name] = tensor.contiguous()
    else:
        if tensor.numel() != 1:
            raise ModelError(f"qweight_type must be one GGUF type, got {tensor.numel()} values")
        parts.setdefault(first, {})[name] = int(tensor.reshape(-1)[0])
