"""Quantized vs unquantized linear layers at SmolLM2-135M's shapes, side by side.

One decoder layer's four GEMMs (fused q/k/v 576 -> 960, o 576 -> 576, fused gate/up
576 -> 3072, down 1536 -> 576) run through each quant method's ``apply`` for 1, 8 and 32
tokens: unquantized (fp32 and bf16), int8 W8A8 (dynamic per-token activations), int8
weight-only in bf16, fp8 W8A8 per tensor and fp8 with 64x64 blocks (both through the
fp8 reference GEMM on CPUs). Printed: microseconds per layer, the ratio to unquantized
fp32, and the ``scaled_mm`` / ``linear`` variants that served. On a GPU, fp8 vs bf16 GEMM
time too; without one that part is reported as not run.

    python benchmarks/quant_linear.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import platform as host
import timeit

import torch
from torch import nn

from hwplug import current_platform, kernels
from hwplug.dtypes import torch_dtype
from hwplug.model_zoo.quant_methods.scaled import Fp8LinearMethod, Int8LinearMethod
from hwplug.model_zoo.quant_methods.unquantized import UnquantizedLinearMethod

#: (input, output) of SmolLM2's four GEMMs per decoder layer.
SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576))
TOKENS = (1, 8, 32)
#: name -> (quant method, model dtype)
METHODS = {
    "unquantized fp32": (UnquantizedLinearMethod(), "float32"),
    "unquantized bf16": (UnquantizedLinearMethod(), "bfloat16"),
    "int8 W8A8": (Int8LinearMethod.from_config({"quant_method": "int8"}), "float32"),
    "int8 weight-only bf16": (Int8LinearMethod.from_config({
        "quant_method": "compressed-tensors", "config_groups": {"g": {
            "targets": ["Linear"], "weights": {"num_bits": 8, "type": "int",
                                               "strategy": "channel"}}}}), "bfloat16"),
    "fp8 per-tensor (reference)": (Fp8LinearMethod.from_config({"quant_method": "fp8"}),
                                   "float32"),
    # SmolLM2's 576-wide layers take no 128x128 blocks; 64x64 ones fit every GEMM
    "fp8 64x64 blocks (reference)": (Fp8LinearMethod.from_config({
        "quant_method": "fp8", "weight_block_size": [64, 64]}), "float32"),
}


def layer(method, input_size: int, output_size: int, dtype: str) -> nn.Module:
    """A linear layer of ``method`` with random weights (scales positive), processed."""
    module = nn.Module()
    module.input_size, module.output_size = input_size, output_size
    method.create_weights(module, input_size, output_size, torch_dtype(dtype), False)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if "scale" in name:
                param.copy_(torch.rand(param.shape, generator=generator) * 0.01 + 0.001)
            elif param.dtype == torch.int8:
                param.copy_(torch.randint(-127, 128, param.shape, generator=generator))
            else:
                param.copy_((torch.randn(param.shape, generator=generator) * 0.05).to(param.dtype))
    method.process_weights_after_loading(module)
    return module


def time_us(fn, repeat: int) -> float:
    fn()  # first call: dispatch choices, packing
    number = 5
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def cpu_rows(repeat: int) -> None:
    print(f"{'method':<32}" + "".join(f"{f'{t} tok us':>12}{'ratio':>8}" for t in TOKENS)
          + "  kernels")
    baseline: dict[int, float] = {}
    for name, (method, dtype) in METHODS.items():
        layers = [layer(method, i, o, dtype) for i, o in SHAPES]
        cells = []
        for tokens in TOKENS:
            x = torch.randn(tokens, 576).to(torch_dtype(dtype))
            wide = torch.randn(tokens, 1536).to(torch_dtype(dtype))

            def run(layers=layers, x=x, wide=wide, method=method):
                for module in layers:
                    method.apply(module, wide if module.input_size == 1536 else x)

            us = time_us(run, repeat)
            baseline.setdefault(tokens, us)
            cells.append(f"{us:>12.0f}{us / baseline[tokens]:>7.2f}x")
        used = {op: sorted(kernels.op(op).variants_used()) for op in ("linear", "scaled_mm")}
        print(f"{name:<32}" + "".join(cells) + "  "
              + "; ".join(f"{op}: {', '.join(v)}" for op, v in used.items() if v))
        for op in ("linear", "scaled_mm"):
            kernels.op(op).invalidate()  # the next row reports its own variants


def gpu_rows(repeat: int) -> None:
    if not torch.cuda.is_available():
        print("GPU fp8 vs bf16 GEMM: not run (no GPU on this machine)")
        return
    print(f"GPU {torch.cuda.get_device_name()}: fp8 (torch._scaled_mm) vs bf16 GEMM, "
          "1024 x 4096 x 4096")
    a = torch.randn(1024, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda").t()
    one = torch.ones((), device="cuda")
    bf16 = (a.bfloat16(), b.bfloat16())
    fp8 = (a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn))

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        seconds = min(timeit.repeat(lambda: (fn(), torch.cuda.synchronize()), number=20,
                                    repeat=repeat)) / 20
        return seconds * 1e6

    t_bf16 = timed(lambda: bf16[0] @ bf16[1])
    t_fp8 = timed(lambda: torch._scaled_mm(*fp8, scale_a=one, scale_b=one,
                                           out_dtype=torch.bfloat16))
    print(f"bf16 {t_bf16:.0f} us, fp8 {t_fp8:.0f} us: fp8 {t_bf16 / t_fp8:.2f}x faster")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    platform = current_platform()
    print(f"platform {platform.name} ({platform.facts.device_name}, {host.machine()}, "
          f"features: {' '.join(sorted(platform.facts.features))}), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    cpu_rows(args.repeat)
    gpu_rows(args.repeat)


if __name__ == "__main__":
    main()
