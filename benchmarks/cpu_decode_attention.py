"""CPU decode attention: the paged reference backend vs SDPA over the same K/V stored contiguously.

Every sequence decodes one token against a ``--context``-token history (``--query-len
Q``: a speculative verify step, Q causal queries per sequence ending the context). The
paged side is the ``paged_attention`` op as the REFERENCE backend calls it (the registry
picks the variant; the table names it) over a KV cache whose blocks are shuffled (as an
allocator leaves them); the contiguous side is
``torch.nn.functional.scaled_dot_product_attention`` over ``[B, Hkv, L, D]`` copies of
the same keys and values. ``--baseline REV`` adds the C decode kernel of git revision REV
(``platforms/cpu/fused/kernels.c`` there, built the way this revision builds its own) on
the same float32 inputs, and the ratio of its time to this revision's kernel's (both
called through this revision's op wrapper, without the registry's dispatch). The sides are timed
interleaved, so load from other processes hits them alike; the table shows the median ms
per call and the ratios.

    python benchmarks/cpu_decode_attention.py            # batch 8, context 2048, 32/8 heads
    python benchmarks/cpu_decode_attention.py --context 8192 --dtypes float32
    python benchmarks/cpu_decode_attention.py --dtypes float32 --batch 1 --query-len 5 \
        --num-heads 9 --num-kv-heads 3 --head-size 64 --layers 30 --baseline HEAD~1
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from revision_files import files_at

from hwplug.attention import AttentionMetadata, PagedAttentionParams
from hwplug.kernel_registry import ops
from hwplug.platforms.cpu.fused import ops as fused

#: The issue's goal: paged decode within this factor of contiguous SDPA.
GOAL_RATIO = 1.5


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-size", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--layers", type=int, default=1,
                        help="KV caches taken in turn, one per call whichever side makes it (a "
                             "model's layers: with enough of them each call reads its K/V "
                             "from memory, not cache)")
    parser.add_argument("--query-len", type=int, default=1,
                        help="causal queries per sequence (k + 1 for a verify step)")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also time REV's C decode kernel (float32 only)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                        choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=50, help="timed calls of each side")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def make_inputs(args: argparse.Namespace, dtype: torch.dtype) -> dict[str, Any]:
    """``--layers`` shuffled paged caches, their block tables, and contiguous copies of the
    same K/V."""
    blocks_per_seq = -(-args.context // args.block_size)
    num_blocks = args.batch * blocks_per_seq
    kv_caches = [torch.randn(2, num_blocks, args.block_size, args.num_kv_heads,
                             args.head_size, dtype=dtype) for _ in range(args.layers)]
    block_tables = torch.randperm(num_blocks).view(args.batch, blocks_per_seq)
    # [2, B, blocks, block_size, Hkv, D] -> [2, B, Hkv, L, D]
    contiguous = [kv[:, block_tables].flatten(2, 3)[:, :, :args.context].transpose(2, 3)
                  .contiguous() for kv in kv_caches]
    q = args.query_len  # query i of a sequence sees keys 0 .. context - q + i
    visible = torch.arange(args.context)[None, :] <= torch.arange(args.context - q,
                                                                   args.context)[:, None]
    return {
        "query": torch.randn(args.batch * q, args.num_heads, args.head_size, dtype=dtype),
        "kv_caches": kv_caches,
        "block_tables": block_tables.int(),
        "seq_lens": torch.full((args.batch,), args.context, dtype=torch.int32),
        "query_start_loc": torch.arange(0, args.batch * q + 1, q, dtype=torch.int32),
        "keys": [kv[0] for kv in contiguous],
        "values": [kv[1] for kv in contiguous],
        "mask": visible,
    }


def baseline_kernels(rev: str, build: str) -> fused.FusedKernels:
    """Revision ``rev``'s ``platforms/cpu/fused/kernels.c`` as ``build`` of this revision's
    library class (its op wrappers; the C signature is unchanged)."""
    kernels = fused.FusedKernels(build)
    kernels.source = files_at(rev, "platforms/cpu/fused/", (".c",), "hwplug-fused") / "kernels.c"
    return kernels


def next_layer(side: Callable[[int], object], layers: Iterator[int]) -> object:
    """``side`` called on the next layer's cache."""
    return side(next(layers))


def interleaved_medians(calls: dict[str, Callable[[], object]], repeats: int,
                        warmup: int) -> dict[str, float]:
    """Median ms per call of each callable, timed in alternating order."""
    for call in calls.values():
        for _ in range(warmup):
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls)
    for repeat in range(repeats):
        for name in order if repeat % 2 == 0 else reversed(order):
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(samples) for name, samples in times.items()}


def run(args: argparse.Namespace, dtype: torch.dtype
        ) -> tuple[dict[str, float], float, str]:
    """(median ms per side, max |difference| from the paged side, variant) for one dtype;
    the sides are paged, contiguous and (with ``--baseline``, float32) kernel and baseline:
    this revision's and the baseline's C kernel through the same op wrapper."""
    torch.manual_seed(args.seed)
    inputs = make_inputs(args, dtype)
    scale = args.head_size ** -0.5
    tokens, num_heads, head_size = inputs["query"].shape
    q = args.query_len
    metadata = AttentionMetadata(torch.zeros(tokens, dtype=torch.int64), inputs["block_tables"],
                                 inputs["seq_lens"], inputs["query_start_loc"], q, args.context)
    params = PagedAttentionParams(scale)

    def paged(layer: int, attend: Callable[..., torch.Tensor] = ops.paged_attention
              ) -> torch.Tensor:
        """``attend`` (the op, or one build's kernel) on ``layer``'s cache."""
        return attend(inputs["query"], inputs["kv_caches"][layer], metadata, params)

    def contiguous(layer: int) -> torch.Tensor:
        query = inputs["query"].view(args.batch, q, num_heads, head_size).transpose(1, 2)
        out = F.scaled_dot_product_attention(query, inputs["keys"][layer],
                                             inputs["values"][layer], attn_mask=inputs["mask"],
                                             scale=scale, enable_gqa=True)
        return out.transpose(1, 2).reshape(tokens, num_heads, head_size)

    with torch.inference_mode():
        ops.paged_attention.invalidate()  # so variants_used() covers this dtype's calls only
        error = (paged(0).float() - contiguous(0).float()).abs().max().item()
        variant = "+".join(sorted(ops.paged_attention.variants_used()))
        sides: dict[str, Callable[[int], torch.Tensor]] = {"paged": paged,
                                                           "contiguous": contiguous}
        if args.baseline and dtype == torch.float32:  # both through the same wrapper
            build = "avx2" if variant == "fused_avx2" else "portable"
            for side, kernels in (("kernel", fused.FusedKernels(build)),
                                  ("baseline", baseline_kernels(args.baseline, build))):
                kernels.ensure_built()
                sides[side] = partial(paged, attend=kernels.paged_attention)
                error = max(error, (sides[side](0) - paged(0)).abs().max().item())
        layers = itertools.cycle(range(args.layers))  # shared: no call finds its cache warm
        medians = interleaved_medians({name: partial(next_layer, side, layers)
                                       for name, side in sides.items()},
                                      args.repeats, args.warmup)
    return medians, error, variant


def main() -> None:
    args = parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"decode: batch {args.batch}, {args.query_len} queries each, context {args.context}, "
          f"{args.layers} layer(s) in turn, "
          f"heads {args.num_heads}/{args.num_kv_heads}, head size {args.head_size}, block size "
          f"{args.block_size}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    # Other processes slow the paged side (many short ops) more than SDPA (one fused op).
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    print(f"{'dtype':<9} {'variant':<12} {'paged ms':>9} {'SDPA ms':>9} {'paged/SDPA':>11} "
          f"{'base ms':>8} {'base/this':>11} {'max |diff|':>11}")
    for name in args.dtypes:
        medians, error, variant = run(args, getattr(torch, name))
        ratio = medians["paged"] / medians["contiguous"]
        verdict = "ok" if ratio <= GOAL_RATIO else f"over the {GOAL_RATIO}x goal"
        base = (f"{medians['baseline']:>8.3f} {medians['baseline'] / medians['kernel']:>10.2f}x"
                if "baseline" in medians else f"{'-':>8} {'-':>11}")
        print(f"{name:<9} {variant:<12} {medians['paged']:>9.3f} {medians['contiguous']:>9.3f} "
              f"{ratio:>10.2f}x {base} {error:>11.2e}  {verdict}")
    print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
