"""Benchmark hwplug-triton's attention kernels against the GPU's copy bandwidth and torch.

Measured side by side in one process:

* copy bandwidth: ``clone()`` of a large buffer (bytes read + written per second), the
  ceiling for a memory-bound kernel;
* paged decode attention (batch 64, context 4096, 32 query / 8 KV heads, D 128, bf16,
  block 16, shuffled block tables): hwplug's split-KV kernel and a naive paged decode
  (gather the blocks, then ``scaled_dot_product_attention``), as K/V bytes read per
  second and as a fraction of the copy bandwidth;
* causal prefill (one sequence of L = 1k .. 16k tokens, 32 heads, D 128, bf16): hwplug's
  paged prefill kernel (K/V in a block-16 cache) against ``scaled_dot_product_attention``
  on contiguous K/V, as time and TFLOP/s.

Each hwplug result also reports its largest difference from the torch result.
Usage: ``python bench_kernels.py [--out RESULTS.md]`` on a GPU machine (CUDA, ROCm or
XPU; the report names the device), or
``python bench_kernels.py --smoke`` to run tiny shapes on CPU in the Triton interpreter
(checks the script, measures nothing meaningful; writes only where ``--out`` says).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from hwplug.attention import AttentionMetadata, PagedAttentionParams

DEFAULT_OUT = Path(__file__).with_name("RESULTS.md")


@dataclass(frozen=True)
class Shapes:
    copy_bytes: int
    decode_batch: int
    decode_context: int
    decode_heads: tuple[int, int]  # (query heads, KV heads)
    prefill_lengths: tuple[int, ...]
    prefill_heads: int
    head_size: int
    block_size: int


FULL = Shapes(copy_bytes=2 << 30, decode_batch=64, decode_context=4096, decode_heads=(32, 8),
              prefill_lengths=(1024, 2048, 4096, 8192, 16384), prefill_heads=32,
              head_size=128, block_size=16)
SMOKE = Shapes(copy_bytes=4 << 20, decode_batch=2, decode_context=64, decode_heads=(4, 2),
               prefill_lengths=(32, 64), prefill_heads=2, head_size=32, block_size=16)


def main() -> None:
    command_line(__doc__, DEFAULT_OUT, lambda smoke, device: run(SMOKE if smoke else FULL,
                                                                 device))


def command_line(doc: str, default_out: Path, report: Callable[[bool, str], str]) -> None:
    """A benchmark script's command line: ``--smoke`` (tiny shapes on CPU through the
    Triton interpreter) and ``--out``; ``report(smoke, device)`` makes the markdown, which
    is printed and written to ``--out`` (default ``default_out``; with --smoke, nowhere).
    Without ``--smoke`` and without a GPU it exits saying so (:func:`gpu_type`)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help=f"markdown file to write (default {default_out}; with --smoke, "
                             "none)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes on CPU through the Triton interpreter")
    args = parser.parse_args()
    if args.smoke:  # triton reads it when imported (in report), not later
        os.environ["TRITON_INTERPRET"] = "1"
    out = args.out or (None if args.smoke else default_out)
    text = report(args.smoke, "cpu" if args.smoke else gpu_type())
    print(text)
    if out is not None:
        out.write_text(text)
        print(f"written to {out}")


def gpu_type() -> str:
    """``"cuda"`` (NVIDIA or ROCm) or ``"xpu"``; exits when there is no GPU."""
    if torch.cuda.is_available():
        return "cuda"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    raise SystemExit("no GPU (CUDA, ROCm or XPU): run on a GPU machine, or pass --smoke")


def run(shapes: Shapes, device: str) -> str:
    import triton

    from hwplug_triton.kernels.attention import paged_attention

    torch.manual_seed(0)
    name = getattr(torch, device).get_device_name() if device != "cpu" else \
        "CPU (Triton interpreter)"
    timer = gpu_timer if device != "cpu" else cpu_timer
    copy_rate = copy_bandwidth(shapes, device, timer)
    lines = [
        "# hwplug-triton kernel benchmarks", "",
        f"- device: {name}",
        f"- torch {torch.__version__}, triton {triton.__version__}, toolkit "
        f"{torch.version.cuda or torch.version.hip or getattr(torch.version, 'xpu', None)}",
        f"- date: {datetime.date.today().isoformat()}", "",
        "## Copy bandwidth", "",
        "| buffer | GB/s (read + write) |", "|---|---|",
        f"| {shapes.copy_bytes / 2**20:.0f} MiB clone | {copy_rate / 1e9:.0f} |", "",
        *decode_section(paged_attention, shapes, device, timer, copy_rate), "",
        *prefill_section(paged_attention, shapes, device, timer), "",
    ]
    return "\n".join(lines)


def gpu_timer(fn: Callable[[], object]) -> float:
    """Median seconds of one call, from device events (triton's do_bench)."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") / 1e3


def cpu_timer(fn: Callable[[], object]) -> float:
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_bandwidth(shapes: Shapes, device: str, timer: Callable) -> float:
    """Bytes per second read plus written by ``clone()``."""
    buffer = torch.empty(shapes.copy_bytes, dtype=torch.uint8, device=device)
    return 2 * shapes.copy_bytes / timer(buffer.clone)


def paged_cache(lengths: list[int], num_kv_heads: int, shapes: Shapes, device: str):
    """A bf16 cache holding ``lengths`` tokens per sequence in shuffled blocks, and the
    ``(block_tables, seq_lens)`` that address it."""
    blocks_per_seq = [-(-n // shapes.block_size) for n in lengths]
    num_blocks = sum(blocks_per_seq)
    kv_cache = torch.randn(2, num_blocks, shapes.block_size, num_kv_heads, shapes.head_size,
                           dtype=torch.bfloat16, device=device)
    order = torch.randperm(num_blocks, device=device).int()
    block_tables = torch.zeros(len(lengths), max(blocks_per_seq), dtype=torch.int32,
                               device=device)
    used = 0
    for i, n in enumerate(blocks_per_seq):
        block_tables[i, :n] = order[used:used + n]
        used += n
    return kv_cache, block_tables, torch.tensor(lengths, dtype=torch.int32, device=device)


def decode_section(paged_attention: Callable, shapes: Shapes, device: str, timer: Callable,
                   copy_rate: float) -> list[str]:
    batch, context = shapes.decode_batch, shapes.decode_context
    num_heads, num_kv_heads = shapes.decode_heads
    scale = shapes.head_size ** -0.5
    kv_cache, block_tables, seq_lens = paged_cache([context] * batch, num_kv_heads, shapes,
                                                   device)
    query = torch.randn(batch, num_heads, shapes.head_size, dtype=torch.bfloat16,
                        device=device)
    query_start_loc = torch.arange(batch + 1, dtype=torch.int32, device=device)

    metadata = AttentionMetadata(torch.zeros(0, dtype=torch.int64, device=device), block_tables,
                                 seq_lens, query_start_loc, 1, context)
    params = PagedAttentionParams(scale)

    def hwplug() -> torch.Tensor:
        return paged_attention(query, kv_cache, metadata, params)

    def naive() -> torch.Tensor:
        keys, values = (kv_cache[i][block_tables].flatten(1, 2).transpose(1, 2)
                        for i in range(2))  # [B, Hkv, L, D]
        out = F.scaled_dot_product_attention(query[:, :, None], keys, values, scale=scale,
                                             enable_gqa=True)
        return out[:, :, 0]

    # every cached token is in context: the whole cache is read, plus queries and outputs
    bytes_read = kv_cache.numel() * kv_cache.element_size() \
        + 2 * query.numel() * query.element_size()
    diff = f"{(hwplug().float() - naive().float()).abs().max().item():.1e}"
    lines = [f"## Paged decode attention (batch {batch}, context {context}, {num_heads} query "
             f"/ {num_kv_heads} KV heads, D {shapes.head_size}, bf16, block "
             f"{shapes.block_size})", "",
             "| implementation | time (us) | GB/s | of copy bandwidth | max abs diff vs naive |",
             "|---|---|---|---|---|"]
    times = {}
    for label, fn, difference in (("hwplug Triton split-KV", hwplug, diff),
                                  ("naive gather + SDPA", naive, "-")):
        times[label] = seconds = timer(fn)
        rate = bytes_read / seconds
        lines.append(f"| {label} | {seconds * 1e6:.0f} | {rate / 1e9:.0f} | "
                     f"{rate / copy_rate:.0%} | {difference} |")
    speedup = times["naive gather + SDPA"] / times["hwplug Triton split-KV"]
    return [*lines, "", f"hwplug / naive speed: {speedup:.2f}x"]


def prefill_section(paged_attention: Callable, shapes: Shapes, device: str,
                    timer: Callable) -> list[str]:
    heads, head_size = shapes.prefill_heads, shapes.head_size
    scale = head_size ** -0.5
    lines = [f"## Causal prefill ({heads} heads, D {head_size}, bf16; hwplug reads K/V from a "
             f"block-{shapes.block_size} paged cache)", "",
             "| L | hwplug (ms) | SDPA (ms) | hwplug TFLOP/s | SDPA TFLOP/s | "
             "hwplug time / SDPA time | max abs diff |", "|---|---|---|---|---|---|---|"]
    for length in shapes.prefill_lengths:
        kv_cache, block_tables, seq_lens = paged_cache([length], heads, shapes, device)
        query = torch.randn(length, heads, head_size, dtype=torch.bfloat16, device=device)
        query_start_loc = torch.tensor([0, length], dtype=torch.int32, device=device)
        keys, values = (kv_cache[i][block_tables[0]].flatten(0, 1)[None].transpose(1, 2)
                        .contiguous() for i in range(2))  # [1, H, L, D]
        queries = query[None].transpose(1, 2).contiguous()

        metadata = AttentionMetadata(torch.zeros(0, dtype=torch.int64, device=device),
                                     block_tables, seq_lens, query_start_loc, length, length)

        def hwplug(query=query, kv_cache=kv_cache, metadata=metadata) -> torch.Tensor:
            return paged_attention(query, kv_cache, metadata, PagedAttentionParams(scale))

        def sdpa(queries=queries, keys=keys, values=values) -> torch.Tensor:
            return F.scaled_dot_product_attention(queries, keys, values, is_causal=True,
                                                  scale=scale)

        diff = (hwplug().float() - sdpa()[0].transpose(0, 1).float()).abs().max().item()
        flops = 2 * 2 * heads * head_size * length * length / 2  # two matmuls, causal half
        ours, theirs = timer(hwplug), timer(sdpa)
        lines.append(f"| {length} | {ours * 1e3:.3f} | {theirs * 1e3:.3f} | "
                     f"{flops / ours / 1e12:.1f} | {flops / theirs / 1e12:.1f} | "
                     f"{ours / theirs:.2f} | {diff:.1e} |")
    return lines


if __name__ == "__main__":
    main()
