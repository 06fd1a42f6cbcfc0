"""Benchmark hwplug-triton's ``mla_attention`` decode against the copy bandwidth and the reference.

Multi-head latent attention at DeepSeek-V3's sizes (128 query heads, ``qk_nope`` 128,
``qk_rope`` 64, ``kv_lora_rank`` 512, ``v_head_dim`` 128), decode-only batches over a paged
latent cache (block 64, shuffled block tables): batch 64 at context 4096, batch 8 at 16k
and one sequence at 32k, with a bf16 cache and with an fp8 e4m3 cache (per-tensor scale).
Each row reports hwplug's time, the cache bytes it reads per second and their fraction of
the measured device-to-device copy bandwidth, the latent-attention TFLOP/s, the op's
pure-torch reference time (gathers the blocks, attends in fp32) and hwplug's largest
difference from it (relative to the reference's largest output).
Usage, on a GPU machine: ``python bench_mla.py [--out RESULTS_mla.md]``; without a GPU it
exits with that message. ``--smoke`` runs tiny shapes on CPU in the Triton interpreter
(checks the script, measures nothing meaningful).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import torch
from bench_kernels import command_line, cpu_timer, gpu_timer

from hwplug.attention import AttentionMetadata

DEFAULT_OUT = Path(__file__).with_name("RESULTS_mla.md")
#: (heads, nope, rope, kv_lora_rank, v_head_dim, block size), [(batch, context)], copy MiB
FULL = ((128, 128, 64, 512, 128, 64), [(64, 4096), (8, 16384), (1, 32768)], 2048)
SMOKE = ((4, 16, 8, 32, 16, 16), [(2, 40)], 4)


def main() -> None:
    command_line(__doc__, DEFAULT_OUT, report)


def report(smoke: bool, device: str) -> str:
    from hwplug.kernel_registry.reference import mla as reference
    from hwplug_triton.kernels import mla

    (heads, nope, rope, lora, v_dim, block_size), batches, copy_mib = SMOKE if smoke else FULL
    timer = cpu_timer if smoke else gpu_timer
    dtype = torch.float32 if smoke else torch.bfloat16
    copy = torch.empty(copy_mib << 20, dtype=torch.uint8, device=device)
    copy_rate = 2 * copy.numel() / timer(copy.clone)
    del copy
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * scale).to(device, dtype)

    w_uk, w_uv = rand(heads, nope, lora, scale=lora ** -0.5), rand(heads, v_dim, lora,
                                                                   scale=lora ** -0.5)
    scale = (nope + rope) ** -0.5
    name = torch.cuda.get_device_name() if device == "cuda" else "Triton interpreter"
    lines = [f"# hwplug-triton mla_attention decode on {device} ({name})", "",
             f"{datetime.date.today()}, torch {torch.__version__}; {heads} heads, nope {nope}, "
             f"rope {rope}, kv_lora_rank {lora}, v_head_dim {v_dim}, queries "
             f"{str(dtype).removeprefix('torch.')}, block {block_size}; copy bandwidth "
             f"{copy_rate / 1e9:.0f} GB/s (read + write)", "",
             "| batch x context | cache | hwplug us | cache GB/s | of copy bandwidth | "
             "TFLOP/s | reference us | max diff / max |",
             "|---|---|---|---|---|---|---|---|"]
    for batch, context in batches:
        blocks_per_seq = -(-context // block_size)
        num_blocks = batch * blocks_per_seq
        latents = torch.randn(num_blocks, block_size, lora + rope, generator=generator)
        order = torch.randperm(num_blocks, generator=generator).int().to(device)
        metadata = AttentionMetadata(
            torch.zeros(0, dtype=torch.int64, device=device),
            order.view(batch, blocks_per_seq),
            torch.full((batch,), context, dtype=torch.int32, device=device),
            torch.arange(batch + 1, dtype=torch.int32, device=device), 1, context)
        q_nope, q_pe = rand(batch, heads, nope), rand(batch, heads, rope)
        caches = [("bf16" if not smoke else "fp32", latents.to(device, dtype), None)]
        if not smoke:
            kv_scale = (latents.abs().max() / 448).to(device)
            caches.append(("fp8 e4m3", (latents.to(device) / kv_scale).to(torch.float8_e4m3fn),
                           kv_scale))
        for label, cache, kv_scale in caches:
            def call(op, cache=cache, kv_scale=kv_scale, q_nope=q_nope, q_pe=q_pe,
                     metadata=metadata):
                return lambda: op(q_nope, q_pe, cache, metadata, w_uk, w_uv, scale, kv_scale)

            with torch.inference_mode():
                ours, ref = call(mla.mla_attention)(), call(reference.mla_attention)()
                diff = ((ours.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                seconds, ref_seconds = timer(call(mla.mla_attention)), \
                    timer(call(reference.mla_attention))
            cache_bytes = batch * context * (lora + rope) * cache.element_size()
            # per head and key: q . [latent, rope] and p . latent, plus the two projections
            flops = 2 * batch * heads * (context * (2 * lora + rope) + 2 * nope * lora)
            lines.append(f"| {batch} x {context} | {label} | {seconds * 1e6:.1f} | "
                         f"{cache_bytes / seconds / 1e9:.0f} | "
                         f"{cache_bytes / seconds / copy_rate:.0%} | "
                         f"{flops / seconds / 1e12:.1f} | {ref_seconds * 1e6:.1f} | "
                         f"{diff:.1e} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
