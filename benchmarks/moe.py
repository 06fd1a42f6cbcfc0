"""One mixture-of-experts layer: hwplug's ``fused_moe`` beside transformers' MoE block.

Qwen3-30B-A3B's sizes (hidden 2048, 128 experts, top-8, expert intermediate 768; softmax
routing, renormalised), random weights, at 1 / 8 / 32 / 256 tokens (1: the decode case).
Rows, each timed per layer call (router included):

- ``transformers eager`` / ``grouped_mm``: ``Qwen3MoeSparseMoeBlock`` (fp32) with its
  experts run by transformers' eager loop or by ``grouped_mm`` (what ``from_pretrained``
  picks where torch runs it); the faster of the two is the baseline of the speedups;
- ``hwplug fused_moe``: the op as the registry dispatches it here (fp32, the same weights;
  on the cpu platform ``moe_topk`` and ``moe_experts`` in one C call each up to 16 tokens,
  the grouped variant above), its largest difference from transformers' output printed;
- ``... C MoE off``: the same with the one-call C variants left out (the reference's
  routing, the grouped variant's experts: what ``HWPLUG_DISABLED_KERNELS=moe_topk/fused_avx2,
  moe_experts/fused_avx2,ggml_moe_experts/fused_vnni`` dispatches), timed in the same
  process, interleaved;
- ``hwplug reference``: the op's pure-torch reference (fp32);
- ``hwplug <TYPE>``: the experts kept in GGUF blocks of ``--gguf-type`` (random blocks of
  the same shapes: speed does not depend on the values), ``ggml_moe_experts`` as
  dispatched, its largest difference from the op's reference on the same blocks printed
  relative to the largest output (random blocks give outputs of any scale).

Printed: microseconds per call, and the faster transformers time over each row's (above
1: faster than transformers), with the CPU and thread count, then the variants that served
the hwplug rows. ``--cpu-time`` times this thread's CPU time on one thread (for a loaded
machine, where wall-clock times mean little). ``--quick`` runs a small layer (hidden
256, 16 experts, top-4, intermediate 128) at 1 and 8 tokens: a check that the script works,
not a measurement.

    python benchmarks/moe.py [--quick] [--repeat 3] [--gguf-type Q4_K] [--cpu-time]
                             [--tokens 1 8 32]

The whole model beside llama.cpp (a 2-layer random-weight GGUF of these shapes, decode at
batch 1 and 8): ``benchmarks/make_gguf.py --shape qwen3-30b-a3b --layers 2``, then
``benchmarks/decode_cpu_time.py`` (CPU time per step) or ``benchmarks/cpu_vs_llamacpp.py
--model`` (tokens/s) on the file; docs/benchmarks.md has both.
"""

from __future__ import annotations

import argparse
import time
import timeit
from collections.abc import Callable

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
from transformers.utils import logging as transformers_logging

from hwplug import current_platform, kernels
from hwplug.kernel_registry import ops
from hwplug.kernel_registry.ops_moe import fused_moe, ggml_moe_experts, moe_experts, moe_topk

#: (hidden, experts, top-k, expert intermediate) of the measured layer and of --quick's.
FULL, QUICK = (2048, 128, 8, 768), (256, 16, 4, 256)
#: transformers' expert implementations timed: its eager loop over the experts hit, and
#: ``grouped_mm``, what ``from_pretrained`` picks where torch can run it (else eager).
TRANSFORMERS = ("eager", "grouped_mm")
TOKENS, QUICK_TOKENS = (1, 8, 32, 256), (1, 8)
#: Seconds of calls each timing aims at (at least one call).
BUDGET_S = 0.3


#: The clock of the timings: wall-clock, or ``--cpu-time``'s thread CPU time.
CLOCK = {"wall": timeit.default_timer, "cpu": time.thread_time}


def time_us(fn: Callable[[], object], repeat: int, clock: str = "wall") -> float:
    timer = CLOCK[clock]
    start = timer()
    fn()  # first call: dispatch, builds
    number = max(1, int(BUDGET_S / max(timer() - start, 1e-6)))
    return min(timeit.Timer(fn, timer=timer).repeat(number=number, repeat=repeat)) \
        / number * 1e6


def eligible(op: str, names: tuple[str, ...]) -> Callable[..., torch.Tensor]:
    """The first of ``op``'s variants ``names`` this CPU runs, its library built."""
    for name in names:
        variant = kernels.get(f"{op}/{name}")
        if variant.device_rejection(current_platform()) is None:
            variant.load()
            if variant.native is not None:
                variant.native.ensure_built()
            return variant.impl
    raise SystemExit(f"none of {op}'s variants {names} runs here")


def transformers_block(hidden: int, experts: int, top_k: int, intermediate: int,
                       implementation: str) -> Qwen3MoeSparseMoeBlock:
    """transformers' block with seeded weights of rms ``fan_in ** -0.5``, its experts run
    by ``implementation``."""
    config = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=intermediate,
                            num_experts=experts, num_experts_per_tok=top_k,
                            norm_topk_prob=True)
    config._experts_implementation = implementation
    block = Qwen3MoeSparseMoeBlock(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in block.parameters():
            param.normal_(0.0, param.shape[-1] ** -0.5, generator=generator)
    return block


def random_blocks(kind: GGMLQuantizationType, experts: int, rows: int, cols: int
                  ) -> torch.Tensor:
    """``uint8 [experts, rows, row_bytes]`` of random blocks of ``kind`` whose fp16 scales
    (every block's first bytes: Q4_K's d and dmin) are small."""
    block, size = GGML_QUANT_SIZES[kind]
    data = torch.randint(0, 256, (experts * rows * cols // block, size), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(1))
    data[:, :4] = torch.tensor([2e-3, 1e-3], dtype=torch.float16).view(torch.uint8)
    return data.view(experts, rows, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small layer: a check, not a "
                                                             "measurement")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gguf-type", default="Q4_K", choices=("Q4_K", "Q4_0", "Q8_0"))
    parser.add_argument("--tokens", type=int, nargs="+", help="token counts (default: "
                        f"{' '.join(map(str, TOKENS))}; --quick: {' '.join(map(str, QUICK_TOKENS))})")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time this thread's CPU time on one thread")
    args = parser.parse_args()
    clock = "cpu" if args.cpu_time else "wall"
    if args.cpu_time:
        torch.set_num_threads(1)
    transformers_logging.set_verbosity_error()  # a standalone block warns of its dispatch
    hidden, experts, top_k, intermediate = QUICK if args.quick else FULL
    platform = current_platform()
    print(f"CPU {platform.facts.device_name}, platform {platform.name}, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads")
    print(f"MoE layer: hidden {hidden}, {experts} experts, top-{top_k}, expert intermediate "
          f"{intermediate}")
    blocks = {name: transformers_block(hidden, experts, top_k, intermediate, name)
              for name in TRANSFORMERS}
    block = blocks["eager"]
    for other in blocks.values():  # one copy of the weights
        other.load_state_dict(block.state_dict(), assign=True)
    router, w13, w2 = (block.gate.weight.data, block.experts.gate_up_proj.data,
                       block.experts.down_proj.data)
    kind = GGMLQuantizationType[args.gguf_type]
    q13 = random_blocks(kind, experts, 2 * intermediate, hidden)
    q2 = random_blocks(kind, experts, hidden, intermediate)

    def ours(x: torch.Tensor) -> torch.Tensor:
        return fused_moe(x, ops.linear(x, router), w13, w2, top_k, True)

    grouped = eligible("moe_experts", ("grouped",))
    grouped_gguf = eligible("ggml_moe_experts", ("grouped_vnni", "grouped_avx2", "grouped_c"))

    def ours_off(x: torch.Tensor) -> torch.Tensor:
        weights, ids = moe_topk.reference(ops.linear(x, router), top_k, True)
        return grouped(x, w13, w2, weights, ids)

    def quantized_off(x: torch.Tensor) -> torch.Tensor:
        weights, ids = moe_topk.reference(ops.linear(x, router), top_k, True)
        return grouped_gguf(x, q13, int(kind), q2, int(kind), weights, ids)

    def reference(x: torch.Tensor) -> torch.Tensor:
        return fused_moe.reference(x, x @ router.T, w13, w2, top_k, True)

    def quantized(x: torch.Tensor, op: Callable[..., torch.Tensor] = ggml_moe_experts
                  ) -> torch.Tensor:
        weights, ids = moe_topk(ops.linear(x, router), top_k, True)
        return op(x, q13, int(kind), q2, int(kind), weights, ids)

    tokens_list = args.tokens or (QUICK_TOKENS if args.quick else TOKENS)
    header = f"{'path':<34}" + "".join(f"{f'{t} tok us':>14}{'speedup':>9}" for t in
                                       tokens_list)
    print(header)
    results: dict[str, list[str]] = {}
    differences: dict[str, float] = {"hwplug fused_moe fp32": 0.0, args.gguf_type: 0.0}
    for tokens in tokens_list:
        x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(tokens))
        with torch.inference_mode():
            want = block(x[None])[0]
            differences["hwplug fused_moe fp32"] = max(
                differences["hwplug fused_moe fp32"], float((ours(x) - want).abs().max()))
            expected = quantized(x, ggml_moe_experts.reference)
            differences[args.gguf_type] = max(differences[args.gguf_type], float(
                (quantized(x) - expected).abs().max() / expected.abs().max()))
            rows = {**{f"transformers {name}": lambda x=x, b=b: b(x[None])
                       for name, b in blocks.items()},
                    "hwplug fused_moe fp32": lambda x=x: ours(x),
                    "hwplug fused_moe fp32, C MoE off": lambda x=x: ours_off(x),
                    "hwplug fused_moe reference fp32": lambda x=x: reference(x),
                    f"hwplug {args.gguf_type} ggml_moe_experts": lambda x=x: quantized(x),
                    f"hwplug {args.gguf_type}, C MoE off": lambda x=x: quantized_off(x)}
            times = {name: time_us(fn, args.repeat, clock) for name, fn in rows.items()}
            baseline = min(times[f"transformers {name}"] for name in TRANSFORMERS)
            for name, us in times.items():
                results.setdefault(name, []).append(f"{us:>14.0f}{baseline / us:>8.2f}x")
    for name, cells in results.items():
        print(f"{name:<34}" + "".join(cells))
    print("variants that served the hwplug rows (the C ones up to 16 tokens): " + ", ".join(
        f"{op.name} {'/'.join(sorted(op.variants_used()))}"
        for op in (moe_topk, fused_moe, moe_experts, ggml_moe_experts)))
    print(f"largest difference: hwplug fused_moe fp32 vs transformers "
          f"{differences['hwplug fused_moe fp32']:.2e}; {args.gguf_type} ggml_moe_experts "
          f"vs its reference {differences[args.gguf_type]:.2e} of the largest output")


if __name__ == "__main__":
    main()
