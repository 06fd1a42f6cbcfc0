"""Autotune hwplug-triton's kernels on this machine's GPU and write the device's table.

For every tuned kernel and size bucket of :mod:`hwplug_triton.tuning`, each candidate
launch config of a small grid is run on a representative call, checked against the
pure-torch reference (a config whose output differs is dropped), and timed with
``triton.testing.do_bench``; the fastest is kept. Candidates are applied through the
tables' user layer (a temporary ``HWPLUG_TUNING_DIR``), so the kernels run exactly as in
production. The script prints, per bucket, the shipped config's time next to the best
one's, measured side by side in this process, names the GPU, and writes
``plugins/triton/hwplug_triton/tables/<vendor>_<device>.json`` (or ``--out``): commit it.

    python benchmarks/tune_triton.py [--kernels rms_norm,paged_attention_decode]
                                     [--buckets 128] [--out F]

On a machine without a GPU (CUDA, ROCm or XPU) it says so and exits with status 2,
writing nothing: tables are only ever measured on the device they are for.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hwplug.attention import AttentionMetadata, PagedAttentionParams

#: kernel -> the candidate grid: each key's values, combined.
GRIDS: dict[str, dict[str, tuple[int, ...]]] = {
    "rms_norm": {"num_warps": (1, 2, 4, 8, 16)},
    "gated_activation": {"block": (512, 1024, 2048, 4096), "num_warps": (2, 4, 8)},
    "rotary_embedding": {"tile": (512, 1024, 2048, 4096), "num_warps": (2, 4, 8)},
    "reshape_and_cache": {"tile": (1024, 2048, 4096), "num_warps": (2, 4, 8)},
    "paged_attention_decode": {"block_n": (16, 32, 64), "num_warps": (2, 4, 8),
                               "num_stages": (1, 2, 3), "min_split_tokens": (256, 512),
                               "waves": (2,)},
    "paged_attention_prefill": {"block_m": (32, 64, 128), "block_n": (32, 64),
                                "num_warps": (4, 8), "num_stages": (1, 2, 3)},
    "mla_attention": {"block_h": (32, 64, 128), "block_n": (16, 32, 64), "num_warps": (4, 8),
                      "num_stages": (1, 2), "min_split_tokens": (256,), "waves": (2,)},
}
DTYPE = torch.bfloat16
#: Attention heads of the representative calls: (query heads, KV heads).
HEADS = (32, 8)
#: DeepSeek-V3's latent attention: query heads, nope and rope head sizes, value head size.
MLA_HEADS, MLA_NOPE, MLA_ROPE, MLA_V = 128, 128, 64, 128


def find_gpu() -> torch.device | None:
    """The first CUDA / ROCm (torch's ``cuda``) or XPU device, or None."""
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.device("xpu", 0)
    return None


def cases(kernel: str, bucket: int, device: torch.device
          ) -> tuple[Callable[[], Any], Callable[[], Any], str]:
    """``(call, reference, op)`` of a representative call in ``bucket``: both return what
    to compare, within ``op``'s tolerance."""
    from hwplug.kernel_registry import reference
    from hwplug_triton.kernels import activation, attention, cache, mla, norm, rotary

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=DTYPE)

    if kernel == "rms_norm":
        x, weight = randn(max(1, 2**22 // bucket), bucket), randn(bucket)
        return (lambda: norm.rms_norm(x, weight, 1e-6),
                lambda: reference.rms_norm(x, weight, 1e-6), kernel)
    if kernel == "gated_activation":
        x = randn(max(1, 2**22 // bucket), 2 * bucket)
        return (lambda: activation.silu_and_mul(x), lambda: reference.silu_and_mul(x),
                "silu_and_mul")
    if kernel == "rotary_embedding":
        query, key = randn(4096, HEADS[0], bucket), randn(4096, HEADS[1], bucket)
        positions = torch.randint(0, 4096, (4096,), device=device)
        cos_sin = reference.build_cos_sin_cache(bucket, 4096, 1e4).to(device)
        return (lambda: rotary.rotary_embedding(positions, query, key, cos_sin, True),
                lambda: reference.rotary_embedding(positions, query, key, cos_sin, True),
                kernel)
    if kernel == "reshape_and_cache":
        key, value = randn(4096, HEADS[1], bucket), randn(4096, HEADS[1], bucket)
        slots = torch.randperm(512 * 16, device=device)[:4096]
        caches = [torch.zeros(2, 512, 16, HEADS[1], bucket, device=device, dtype=DTYPE)
                  for _ in range(2)]

        def write(fn: Callable[..., None], target: torch.Tensor) -> torch.Tensor:
            fn(key, value, target, slots, PagedAttentionParams(1.0))
            return target
        return (lambda: write(cache.reshape_and_cache, caches[0]),
                lambda: write(reference.reshape_and_cache, caches[1]), kernel)
    if kernel == "mla_attention":  # decode, 64 sequences of 4096 keys, latent width <= bucket
        return (*mla_case(min(bucket, 512), device, randn, mla.mla_attention,
                          reference.mla_attention), kernel)
    decode = kernel == "paged_attention_decode"
    seqs, context, head_size = (64, min(bucket, 8192), 128) if decode else (1, 4096, bucket)
    blocks = -(-context // 16)
    kv_cache = randn(2, seqs * blocks, 16, HEADS[1], head_size)
    tables = torch.randperm(seqs * blocks, device=device, dtype=torch.int32).view(seqs, blocks)
    seq_lens = torch.full((seqs,), context, device=device, dtype=torch.int32)
    queries = 1 if decode else context
    query = randn(seqs * queries, HEADS[0], head_size)
    starts = torch.arange(0, seqs * queries + 1, queries, device=device, dtype=torch.int32)
    metadata = AttentionMetadata(torch.zeros(0, dtype=torch.int64, device=device), tables,
                                 seq_lens, starts, queries, context)
    args = (query, kv_cache, metadata, PagedAttentionParams(head_size ** -0.5))
    return (lambda: attention.paged_attention(*args),
            lambda: reference.paged_attention(*args), "paged_attention")


def mla_case(latent: int, device: torch.device, randn: Callable[..., torch.Tensor],
             kernel: Callable[..., torch.Tensor], oracle: Callable[..., torch.Tensor]
             ) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """``(call, reference)`` of a decode-only ``mla_attention`` batch: 64 sequences of 4096
    cached latents (``latent + MLA_ROPE`` wide, block 64, shuffled tables)."""
    seqs, context, block = 64, 4096, 64
    blocks = seqs * context // block
    kv_cache = randn(blocks, block, latent + MLA_ROPE)
    tables = torch.randperm(blocks, device=device, dtype=torch.int32).view(seqs, -1)
    metadata = AttentionMetadata(torch.zeros(0, dtype=torch.int64, device=device), tables,
                                 torch.full((seqs,), context, device=device, dtype=torch.int32),
                                 torch.arange(seqs + 1, device=device, dtype=torch.int32), 1,
                                 context)
    args = (randn(seqs, MLA_HEADS, MLA_NOPE), randn(seqs, MLA_HEADS, MLA_ROPE), kv_cache,
            metadata, randn(MLA_HEADS, MLA_NOPE, latent) * latent ** -0.5,
            randn(MLA_HEADS, MLA_V, latent) * latent ** -0.5, (MLA_NOPE + MLA_ROPE) ** -0.5)
    return lambda: kernel(*args), lambda: oracle(*args)


def candidates(kernel: str) -> list[dict[str, int]]:
    grid = GRIDS[kernel]
    return [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]


def apply(user_dir: Path, kernel: str, device_key: str, bucket: int,
          config: dict[str, int] | None) -> None:
    """Make ``config`` the user layer's entry (None: no user layer), and rebuild tables."""
    from hwplug_triton import tuning

    path = user_dir / f"{kernel}.json"
    if config is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(json.dumps({device_key: {str(bucket): config}}))
    tuning.table.cache_clear()
    tuning.device_key.cache_clear()


def measure(call: Callable[[], Any], oracle: Callable[[], Any], op: str) -> float | None:
    """Median milliseconds of ``call``, or None when it fails or differs from ``oracle``."""
    import triton.testing

    from hwplug.kernel_registry import ops  # noqa: F401  (defines the ops in the registry)
    from hwplug.kernel_registry.registry import kernels

    try:
        atol, rtol = kernels.op(op).tolerances[str(DTYPE).removeprefix("torch.")]
        for actual, expected in zip(*(_flat(f()) for f in (call, oracle)), strict=True):
            torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)
        return triton.testing.do_bench(call, warmup=10, rep=50, return_mode="median")
    except Exception as exc:  # a config that does not compile or fit is not a candidate
        print(f"    dropped: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
        return None


def _flat(result: Any) -> tuple[torch.Tensor, ...]:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def tune(kernels: list[str], device: torch.device, device_key: str, user_dir: Path,
         only: set[int] | None = None) -> dict[str, dict[str, dict[str, int]]]:
    """The best config of every bucket of ``kernels`` (those in ``only`` where given),
    printing shipped vs best times."""
    from hwplug_triton import tuning

    best: dict[str, dict[str, dict[str, int]]] = {}
    print(f"{'kernel':<24} {'bucket':>8} {'shipped ms':>11} {'best ms':>9} {'speedup':>8}  best")
    for kernel in kernels:
        for bucket in sorted(int(b) for b in tuning.shipped_tables()[0]["kernels"][kernel]
                             if only is None or int(b) in only):
            call, oracle, op = cases(kernel, bucket, device)
            apply(user_dir, kernel, device_key, bucket, None)
            shipped = measure(call, oracle, op)
            timed = []
            for config in candidates(kernel):
                apply(user_dir, kernel, device_key, bucket, config)
                seconds = measure(call, oracle, op)
                if seconds is not None:
                    timed.append((seconds, config))
            apply(user_dir, kernel, device_key, bucket, None)
            if not timed:
                print(f"{kernel:<24} {bucket:>8} no candidate ran: kept out of the table")
                continue
            fastest, config = min(timed, key=lambda pair: pair[0])
            best.setdefault(kernel, {})[str(bucket)] = config
            ratio = f"{shipped / fastest:.2f}x" if shipped else "-"
            print(f"{kernel:<24} {bucket:>8} {shipped or float('nan'):>11.4f} {fastest:>9.4f} "
                  f"{ratio:>8}  {config}")
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", default=",".join(GRIDS),
                        help=f"comma-separated subset of {', '.join(GRIDS)}")
    parser.add_argument("--buckets", type=int, nargs="+",
                        help="tune only these buckets of each kernel (default: all)")
    parser.add_argument("--out", type=Path, help="table file to write (default: the "
                                                 "device's file among the shipped tables)")
    args = parser.parse_args()
    device = find_gpu()
    if device is None:
        print(f"tune_triton: no GPU here (torch {torch.__version__} sees no CUDA, ROCm or XPU "
              "device); run it on the GPU whose table you want. Nothing was written.",
              file=sys.stderr)
        return 2
    kernels = [k for k in args.kernels.split(",") if k]
    unknown = sorted(set(kernels) - set(GRIDS))
    if unknown:
        parser.error(f"unknown kernels {', '.join(unknown)}; known: {', '.join(GRIDS)}")
    import triton

    from hwplug import current_platform
    from hwplug_triton import tuning

    platform = current_platform()
    name, key = platform.get_device_name(device.index), platform.canonical_device_name(
        device.index)
    print(f"device: {name} ({key}), platform {platform.name}; torch {torch.__version__}, "
          f"triton {triton.__version__}; {DTYPE}")
    with tempfile.TemporaryDirectory() as user_dir:
        os.environ["HWPLUG_TUNING_DIR"] = user_dir
        best = tune(kernels, device, key, Path(user_dir),
                    set(args.buckets) if args.buckets else None)
    out = args.out or tuning.TABLE_DIR / tuning.table_file_name(platform.vendor, key)
    entry = json.loads(out.read_text()) if out.exists() else {"kernels": {}}
    tuned = "; ".join(f"{kernel} {', '.join(buckets)}" for kernel, buckets in best.items())
    source = (f"{tuned}: benchmarks/tune_triton.py on {name}, {datetime.date.today()}, "
              f"torch {torch.__version__}, triton {triton.__version__}")
    entry.update(device=key, vendor=platform.vendor,
                 source=f"{source}; before that: {entry['source']}" if "source" in entry
                 else source)
    for kernel, buckets in best.items():  # the buckets not tuned keep their configs
        entry["kernels"].setdefault(kernel, {}).update(buckets)
    out.write_text(json.dumps(entry, indent=2) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
