"""Benchmark hwplug-triton's quantized-weight GEMMs against what torch offers, side by side.

Measured in one process on one GPU, each row against its baseline:

* ``ggml_linear`` (GGUF blocks dequantized in registers) at Llama-3-8B's projection
  shapes for Q4_0, Q8_0, Q4_K and Q6_K, bf16 activations, 1 / 16 / 128 / 2048 rows, against
  the reference's per-call ``dequantize`` + ``torch.matmul`` (what a GPU without a kernel
  does) and against ``torch.matmul`` on a bf16 weight dequantized once (the speed of a
  dequantized model, at 3.5-4.3x the weight memory);
* ``scaled_mm`` for fp8 e4m3 with DeepSeek-V3 scales (per-token groups of 128, weight
  blocks of 128 x 128) at DeepSeek-V3's shapes, against ``torch._scaled_mm`` (cuBLASLt)
  with per-tensor scales (coarser scales, the fastest fp8 GEMM torch has), against
  ``torch._scaled_mm`` with the same block scales where this torch takes them (else the
  row says why not), and against ``torch.matmul`` in bf16.

Each hwplug row reports its largest difference from the reference op (the pure-torch
dequantize-then-multiply), and the ratio ``baseline time / hwplug time`` (above 1: hwplug
is faster). Usage, on a GPU machine (CUDA; ROCm and XPU run the GGUF part, their fp8 path
may differ): ``python bench_quant.py [--out RESULTS_quant.md]``; without a GPU it exits
with that message. ``--smoke`` runs tiny shapes on CPU in the Triton interpreter (checks
the script, measures nothing meaningful).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from bench_kernels import command_line, cpu_timer, gpu_timer
from gguf import GGMLQuantizationType

from hwplug.platforms.cpu.probe import probe as cpu_probe

DEFAULT_OUT = Path(__file__).with_name("RESULTS_quant.md")
Q = GGMLQuantizationType


@dataclass(frozen=True)
class Shapes:
    ggml_types: tuple[Q, ...]
    ggml_layers: tuple[tuple[str, int, int], ...]  # (name, N, K)
    ggml_rows: tuple[int, ...]
    fp8_layers: tuple[tuple[str, int, int], ...]
    fp8_rows: tuple[int, ...]


FULL = Shapes(ggml_types=(Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q6_K),
              ggml_layers=(("qkv", 6144, 4096), ("gate_up", 28672, 4096),
                           ("down", 4096, 14336)),
              ggml_rows=(1, 16, 128, 2048),
              fp8_layers=(("q_b", 24576, 1536), ("o", 7168, 16384),
                          ("gate_up", 36864, 7168), ("down", 7168, 18432)),
              fp8_rows=(1, 16, 128, 1024, 4096))
SMOKE = Shapes(ggml_types=(Q.Q4_K,), ggml_layers=(("tiny", 64, 512),), ggml_rows=(20,),
               fp8_layers=(("tiny", 256, 256),), fp8_rows=(20,))


def main() -> None:
    command_line(__doc__, DEFAULT_OUT, lambda smoke, device: run(SMOKE if smoke else FULL,
                                                                 device))


def run(shapes: Shapes, device: str) -> str:
    import triton

    name = getattr(torch, device).get_device_name() if device != "cpu" else \
        "CPU (Triton interpreter)"
    timer = gpu_timer if device != "cpu" else cpu_timer
    lines = ["# hwplug-triton quantized GEMM benchmarks", "",
             f"- device: {name}; host CPU: {cpu_probe().devices[0]}",
             f"- torch {torch.__version__}, triton {triton.__version__}, toolkit "
             f"{torch.version.cuda or torch.version.hip or getattr(torch.version, 'xpu', None)}",
             f"- date: {datetime.date.today().isoformat()}",
             "- ratio: baseline time / hwplug time (above 1: hwplug faster)", "",
             *ggml_section(shapes, device, timer), "", *fp8_section(shapes, device, timer), ""]
    return "\n".join(lines)


def ggml_section(shapes: Shapes, device: str, timer: Callable) -> list[str]:
    from hwplug.kernel_registry.reference import ggml
    from hwplug.kernel_registry.reference.ggml_weights import ggml_weight
    from hwplug_triton.kernels.ggml_linear import ggml_linear

    lines = ["## ggml_linear (GGUF weights, bf16 activations)", "",
             "| type | layer (N x K) | M | hwplug (us) | weight GB/s | dequantize + matmul "
             "(us) | ratio | bf16 matmul, weight dequantized once (us) | ratio | max abs diff "
             "vs reference |", "|---|---|---|---|---|---|---|---|---|---|"]
    generator = torch.Generator().manual_seed(0)
    for kind in shapes.ggml_types:
        for label, n, k in shapes.ggml_layers:
            qweight = ggml_weight(generator, int(kind), n, k).to(device)
            dense = ggml.dequantize(qweight, int(kind)).to(torch.bfloat16)
            for m in shapes.ggml_rows:
                x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
                ours = timer(lambda x=x, q=qweight, t=int(kind): ggml_linear(x, q, t))
                naive = timer(lambda x=x, q=qweight, t=int(kind): F.linear(
                    x, ggml.dequantize(q, t).to(torch.bfloat16)))
                once = timer(lambda x=x, w=dense: F.linear(x, w))
                diff = (ggml_linear(x, qweight, int(kind)).float()
                        - ggml.ggml_linear(x, qweight, int(kind)).float()).abs().max().item()
                rate = qweight.numel() / ours / 1e9
                lines.append(f"| {kind.name} | {label} {n} x {k} | {m} | {ours * 1e6:.1f} | "
                             f"{rate:.0f} | {naive * 1e6:.1f} | {naive / ours:.2f} | "
                             f"{once * 1e6:.1f} | {once / ours:.2f} | {diff:.1e} |")
            del qweight, dense
    return lines


def fp8_section(shapes: Shapes, device: str, timer: Callable) -> list[str]:
    from hwplug.kernel_registry.reference import scaled_mm as reference
    from hwplug_triton.kernels.scaled_mm import scaled_mm

    fp8 = torch.float8_e4m3fn
    lines = ["## scaled_mm (fp8 e4m3, 1x128 activation groups, 128x128 weight blocks, "
             "bf16 out)", "",
             "| layer (N x K) | M | hwplug (us) | TFLOP/s | _scaled_mm per-tensor (us) | ratio "
             "| _scaled_mm block scales (us) | ratio | bf16 matmul (us) | ratio | max abs diff "
             "vs reference |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, n, k in shapes.fp8_layers:
        weight = torch.randn(n, k, device=device).to(fp8)
        weight_scale = torch.rand(n // 128, k // 128, device=device) + 0.5  # checkpoint's
        dense_weight = weight.to(torch.bfloat16)
        for m in shapes.fp8_rows:
            a = torch.randn(m, k, device=device).to(fp8)
            a_scale = torch.rand(m, k // 128, device=device) + 0.5
            args = (a, weight.t(), a_scale, weight_scale.t(), torch.bfloat16)
            ours = timer(lambda args=args: scaled_mm(*args))
            expected = reference(*args).float()
            diff = (scaled_mm(*args).float() - expected).abs().max().item()
            one = torch.ones((), device=device)
            tensor = _torch_scaled_mm(timer, a, weight, one, one)
            blocks = _torch_scaled_mm(timer, a, weight, a_scale, weight_scale.t(), expected)
            a16 = a.to(torch.bfloat16)
            dense = timer(lambda a16=a16, w=dense_weight: F.linear(a16, w))
            flops = 2 * m * n * k
            lines.append(f"| {label} {n} x {k} | {m} | {ours * 1e6:.1f} | "
                         f"{flops / ours / 1e12:.1f} | {_cell(tensor, ours)} | "
                         f"{_cell(blocks, ours)} | {dense * 1e6:.1f} | {dense / ours:.2f} | "
                         f"{diff:.1e} |")
    return lines


def _torch_scaled_mm(timer: Callable, a: torch.Tensor, weight: torch.Tensor,
                     scale_a: torch.Tensor, scale_b: torch.Tensor,
                     expected: torch.Tensor | None = None) -> float | str:
    """Seconds of ``torch._scaled_mm`` with these scales, or why they do not count: torch
    refused them, or its result is not ``expected`` (within scaled_mm's bf16 tolerance)."""
    def call() -> torch.Tensor:
        return torch._scaled_mm(a, weight.t(), scale_a=scale_a, scale_b=scale_b,
                                out_dtype=torch.bfloat16)

    try:
        result = call().float()
    except (RuntimeError, ValueError, NotImplementedError) as exc:
        return f"refused: {str(exc).splitlines()[0][:80]}"
    if expected is not None and not torch.allclose(result, expected, atol=2e-2, rtol=2e-2):
        return f"wrong result (max abs diff {(result - expected).abs().max().item():.1e})"
    return timer(call)


def _cell(seconds: float | str, ours: float) -> str:
    """``time | ratio`` cells of a baseline (or its refusal and a dash)."""
    if isinstance(seconds, str):
        return f"{seconds} | -"
    return f"{seconds * 1e6:.1f} | {seconds / ours:.2f}"


if __name__ == "__main__":
    main()
