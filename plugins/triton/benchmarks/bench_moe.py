"""Benchmark hwplug-triton's ``moe_experts`` against the reference and transformers' MoE block.

One MoE layer at Qwen3-30B-A3B's sizes (hidden 2048, 128 experts, top-8, expert
intermediate 768; bf16, random weights), at 1 / 8 / 32 / 256 / 2048 tokens, router and
top-k included in every row: hwplug's grouped GEMMs (``moe_experts``), the op's pure-torch
reference (a loop over the chosen experts), and transformers' ``Qwen3MoeSparseMoeBlock``
with its ``eager`` and ``grouped_mm`` expert implementations (the faster of the two is the
baseline: ratio = its time / hwplug's, above 1: hwplug is faster). Each hwplug row
reports its largest difference from the reference op. Usage, on a GPU machine:
``python bench_moe.py [--out RESULTS_moe.md]``; without a GPU it exits with that message.
``--smoke`` runs a tiny layer on CPU in the Triton interpreter (checks the script,
measures nothing meaningful).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import torch
from bench_kernels import command_line, cpu_timer, gpu_timer

DEFAULT_OUT = Path(__file__).with_name("RESULTS_moe.md")
#: (hidden, experts, top-k, intermediate), token counts.
FULL = ((2048, 128, 8, 768), (1, 8, 32, 256, 2048))
SMOKE = ((64, 8, 2, 32), (3,))
TRANSFORMERS = ("eager", "grouped_mm")


def main() -> None:
    command_line(__doc__, DEFAULT_OUT, report)


def report(smoke: bool, device: str) -> str:
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
    from transformers.utils import logging as transformers_logging

    from hwplug.kernel_registry.reference import moe as reference
    from hwplug_triton.kernels import moe

    transformers_logging.set_verbosity_error()  # a standalone block warns of its dispatch
    (hidden, experts, top_k, intermediate), tokens_list = SMOKE if smoke else FULL
    timer = cpu_timer if smoke else gpu_timer
    dtype = torch.float32 if smoke else torch.bfloat16
    generator = torch.Generator().manual_seed(0)

    def weight(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * shape[-1] ** -0.5).to(device, dtype)

    w13, w2, gate = (weight(experts, 2 * intermediate, hidden),
                     weight(experts, hidden, intermediate), weight(experts, hidden))
    blocks = {}
    for name in TRANSFORMERS:
        config = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=intermediate,
                                num_experts=experts, num_experts_per_tok=top_k,
                                norm_topk_prob=True)
        config._experts_implementation = name
        block = Qwen3MoeSparseMoeBlock(config).to(device, dtype).eval()
        block.experts.gate_up_proj.data, block.experts.down_proj.data = w13, w2
        block.gate.weight.data = gate
        blocks[name] = block
    lines = [f"# hwplug-triton moe_experts on {device} "
             f"({torch.cuda.get_device_name() if device == 'cuda' else 'Triton interpreter'})",
             "", f"{datetime.date.today()}, torch {torch.__version__}; hidden {hidden}, "
             f"{experts} experts, top-{top_k}, intermediate {intermediate}, "
             f"{str(dtype).removeprefix('torch.')}", "",
             "| tokens | hwplug us | reference us | transformers eager us | "
             "transformers grouped_mm us | ratio | max diff vs reference |",
             "|---|---|---|---|---|---|---|"]
    for tokens in tokens_list:
        x = torch.randn(tokens, hidden, generator=generator).to(device, dtype)

        def routed(experts_fn, x=x):
            return lambda: experts_fn(x, w13, w2, *reference.moe_topk(x @ gate.T, top_k))

        with torch.inference_mode():
            diff = (routed(moe.moe_experts)().float()
                    - routed(reference.moe_experts)().float()).abs().max().item()
            ours, ref = timer(routed(moe.moe_experts)), timer(routed(reference.moe_experts))
            theirs = {name: timer(lambda b=b, x=x: b(x[None])) for name, b in blocks.items()}
        lines.append(f"| {tokens} | {ours * 1e6:.1f} | {ref * 1e6:.1f} | "
                     + " | ".join(f"{theirs[name] * 1e6:.1f}" for name in TRANSFORMERS)
                     + f" | {min(theirs.values()) / ours:.2f} | {diff:.1e} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
