"""CPU decode attention: the paged reference backend vs SDPA over the same K/V stored contiguously.

Every sequence decodes one token against a ``--context``-token history. The paged side
is the ``paged_attention`` op as the REFERENCE backend calls it (the registry picks the
variant; the table names it) over a KV cache whose blocks are shuffled (as an allocator
leaves them); the contiguous
side is ``torch.nn.functional.scaled_dot_product_attention`` over ``[B, Hkv, L, D]``
copies of the same keys and values. The two are timed interleaved, so load from other
processes hits both alike; the table shows the median ms per call and paged/contiguous.

    python benchmarks/cpu_decode_attention.py            # batch 8, context 2048, 32/8 heads
    python benchmarks/cpu_decode_attention.py --context 8192 --dtypes float32
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from hwplug.attention import AttentionMetadata, PagedAttentionParams
from hwplug.kernel_registry import ops

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
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                        choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=50, help="timed calls of each side")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def make_inputs(args: argparse.Namespace, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A shuffled paged cache, its block tables, and contiguous copies of the same K/V."""
    blocks_per_seq = -(-args.context // args.block_size)
    num_blocks = args.batch * blocks_per_seq
    kv_cache = torch.randn(2, num_blocks, args.block_size, args.num_kv_heads, args.head_size,
                           dtype=dtype)
    block_tables = torch.randperm(num_blocks).view(args.batch, blocks_per_seq)
    # [2, B, blocks, block_size, Hkv, D] -> [2, B, Hkv, L, D]
    contiguous = kv_cache[:, block_tables].flatten(2, 3)[:, :, :args.context]
    contiguous = contiguous.transpose(2, 3).contiguous()
    return {
        "query": torch.randn(args.batch, args.num_heads, args.head_size, dtype=dtype),
        "kv_cache": kv_cache,
        "block_tables": block_tables.int(),
        "seq_lens": torch.full((args.batch,), args.context, dtype=torch.int32),
        "query_start_loc": torch.arange(args.batch + 1, dtype=torch.int32),
        "keys": contiguous[0],
        "values": contiguous[1],
    }


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


def run(args: argparse.Namespace, dtype: torch.dtype) -> tuple[float, float, float, str]:
    """(paged ms, contiguous ms, max |paged - contiguous|, variant) for one dtype."""
    torch.manual_seed(args.seed)
    inputs = make_inputs(args, dtype)
    scale = args.head_size ** -0.5
    batch, num_heads, head_size = inputs["query"].shape
    metadata = AttentionMetadata(torch.zeros(batch, dtype=torch.int64), inputs["block_tables"],
                                 inputs["seq_lens"], inputs["query_start_loc"], 1, args.context)
    params = PagedAttentionParams(scale)

    def paged() -> torch.Tensor:
        return ops.paged_attention(inputs["query"], inputs["kv_cache"], metadata, params)

    def contiguous() -> torch.Tensor:
        out = F.scaled_dot_product_attention(inputs["query"].unsqueeze(2), inputs["keys"],
                                             inputs["values"], scale=scale, enable_gqa=True)
        return out.view(batch, num_heads, head_size)

    with torch.inference_mode():
        ops.paged_attention.invalidate()  # so variants_used() covers this dtype's calls only
        error = (paged().float() - contiguous().float()).abs().max().item()
        medians = interleaved_medians({"paged": paged, "contiguous": contiguous},
                                      args.repeats, args.warmup)
    variant = "+".join(sorted(ops.paged_attention.variants_used()))
    return medians["paged"], medians["contiguous"], error, variant


def main() -> None:
    args = parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(f"decode: batch {args.batch}, context {args.context}, heads {args.num_heads}/"
          f"{args.num_kv_heads}, head size {args.head_size}, block size {args.block_size}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    # Other processes slow the paged side (many short ops) more than SDPA (one fused op).
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    print(f"{'dtype':<9} {'variant':<12} {'paged ms':>9} {'SDPA ms':>9} {'paged/SDPA':>11} "
          f"{'max |diff|':>11}")
    for name in args.dtypes:
        paged_ms, contiguous_ms, error, variant = run(args, getattr(torch, name))
        ratio = paged_ms / contiguous_ms
        verdict = "ok" if ratio <= GOAL_RATIO else f"over the {GOAL_RATIO}x goal"
        print(f"{name:<9} {variant:<12} {paged_ms:>9.2f} {contiguous_ms:>9.2f} {ratio:>10.2f}x "
              f"{error:>11.2e}  {verdict}")
    print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
