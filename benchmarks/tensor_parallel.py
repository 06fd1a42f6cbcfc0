"""Tensor parallelism: decode tokens/s of 1 rank vs N ranks, and the collectives' bytes.

SmolLM2-135M (dequantized: GGUF blocks cannot be split) in float32 is run by
``hwplug.LLM(..., tensor_parallel_size=1)`` and ``tensor_parallel_size=N`` (the N-1 other
ranks spawned by the LLM, CPUs given by ``HWPLUG_CPU_BIND``, default ``auto``). Its 9
query and 3 KV heads split over 3 ranks, not 2: for an N its heads do not split over,
both sides run SmolLM2's shapes with the query heads rounded down to a multiple of N (8
heads of 72 for N=2) and N KV heads, random weights (written to a temporary directory
with SmolLM2's tokenizer): the same hidden size, layers, MLP and vocabulary. For each
batch size both generate greedily from the same random prompts and ignore EOS. Decode
tokens/s is ``batch * (T - 1) / (t(T) - t(1))`` where ``t(n)`` is the wall time of a
generate call for ``n`` new tokens, so prefill is excluded alike for both; the median of
``--repeats`` is kept. The outputs of both sides must be the same tokens.

Collective bytes are counted, not computed: in the N-rank run, rank 0's
:class:`~hwplug.communicator.DeviceCommunicator` is wrapped to add up the bytes each
all-reduce is given (its payload; a ring all-reduce sends about ``2 (N-1)/N`` of it) and
each all-gather returns (the gathered logits). Per decode token they are set beside what
the model's shapes imply: ``hidden_size * 4 bytes * (2 per layer + 1 for the embedding)``
all-reduced and ``vocab_size * 4 bytes`` of logits gathered.

Each side runs in a fresh process, one after the other, so no side's idle OpenMP workers
(they spin for a while after their last call) share the cores with the other; this script prints both side by side with their ratio.

    python benchmarks/tensor_parallel.py                # TP 1 vs 2 (8-head variant), batch 1, 8
    python benchmarks/tensor_parallel.py --ranks 3      # the real SmolLM2 weights
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Prefix of a side's result line on its stdout.
MARKER = "TP-RESULT "


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="N, the tensor-parallel side")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=32, help="T new tokens per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="tokens per prompt")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per length")
    parser.add_argument("--side", type=int, help=argparse.SUPPRESS)  # run one side here
    parser.add_argument("--model", help=argparse.SUPPRESS)  # the variant's directory
    return parser.parse_args()


def cpu_model() -> str:
    """The CPU's model name (the platform's probe), and how many CPUs this process may use."""
    import os

    from hwplug import current_platform

    return f"{current_platform().facts.device_name}, {len(os.sched_getaffinity(0))} CPUs"


class CollectiveBytes:
    """Wraps :class:`DeviceCommunicator` in this process to count collective bytes."""

    def __init__(self) -> None:
        from hwplug.communicator import DeviceCommunicator

        self.all_reduce = self.all_gather = 0
        reduce, gather = DeviceCommunicator.all_reduce, DeviceCommunicator.all_gatherv

        def counted_reduce(comm: Any, x: Any) -> Any:
            self.all_reduce += x.numel() * x.element_size()
            return reduce(comm, x)

        def counted_gather(comm: Any, x: Any, sizes: Any, dim: int = 0) -> Any:
            out = gather(comm, x, sizes, dim)
            self.all_gather += out.numel() * out.element_size()
            return out

        DeviceCommunicator.all_reduce = counted_reduce
        DeviceCommunicator.all_gatherv = counted_gather

    def snapshot(self) -> tuple[int, int]:
        return self.all_reduce, self.all_gather


def model_for(ranks: int, scratch: Path) -> tuple[str | None, str]:
    """The checkpoint both sides load (None: SmolLM2 itself) and how to name it."""
    from hwplug.model_zoo.loaders import load_checkpoint, resolve_model

    checkpoint = load_checkpoint(resolve_model(None))
    config = checkpoint.config
    heads = config.num_attention_heads
    if heads % ranks == 0 and config.num_key_value_heads % ranks == 0:
        return None, "SmolLM2-135M"
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    heads -= heads % ranks
    config = LlamaConfig.from_dict({  # float weights: not the GGUF's quantization
        **{k: v for k, v in config.to_dict().items() if k != "quantization_config"},
        "num_attention_heads": heads, "num_key_value_heads": ranks,
        "head_dim": config.hidden_size // heads})
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(scratch, safe_serialization=True)
    checkpoint.tokenizer.save_pretrained(scratch)
    return str(scratch), (f"SmolLM2-135M's shapes with {heads} heads of {config.head_dim} "
                          f"and {ranks} KV heads (random weights)")


def run_side(args: argparse.Namespace) -> dict[str, Any]:
    """Load the model with ``args.side`` ranks and time every batch size."""
    import hwplug

    hwplug.current_platform().apply_process_env()  # as `hwplug generate` does
    counter = CollectiveBytes()
    llm = hwplug.LLM(args.model, dequantize=args.model is None, dtype="float32",
                     num_kv_blocks=256, tensor_parallel_size=args.side)
    config = llm.hf_config
    rng = random.Random(0)
    result: dict[str, Any] = {"shapes": {"hidden": config.hidden_size,
                                         "layers": config.num_hidden_layers,
                                         "vocab": config.vocab_size}, "batches": {}}

    def timed(prompts: list[list[int]], tokens: int) -> tuple[float, Any, tuple[int, int]]:
        params = hwplug.SamplingParams(max_tokens=tokens, ignore_eos=True)
        before = counter.snapshot()
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        seconds = time.perf_counter() - start
        after = counter.snapshot()
        return seconds, outputs, (after[0] - before[0], after[1] - before[1])

    for batch in args.batch_sizes:
        prompts = [[rng.randrange(1000, 40000) for _ in range(args.prompt_tokens)]
                   for _ in range(batch)]
        timed(prompts, 2)  # warm-up
        shorts, longs = [], []
        for _ in range(args.repeats):
            shorts.append(timed(prompts, 1))
            longs.append(timed(prompts, args.new_tokens))
        decode = statistics.median(long[0] for long in longs) - statistics.median(
            short[0] for short in shorts)
        decoded = batch * (args.new_tokens - 1)
        per_token = [(b - a) / decoded for a, b in zip(shorts[0][2], longs[0][2], strict=True)]
        result["batches"][str(batch)] = {
            "tokens_per_s": decoded / decode,
            "all_reduce_bytes_per_token": per_token[0],
            "all_gather_bytes_per_token": per_token[1],
            "tokens": [o.token_ids for o in longs[0][1]]}
    llm.close()
    return result


def main() -> None:
    args = parse_args()
    if args.side is not None:
        print(MARKER + json.dumps(run_side(args)), flush=True)
        return
    sides = {}
    with tempfile.TemporaryDirectory(prefix="hwplug-tp-bench-") as scratch:
        model, name = model_for(args.ranks, Path(scratch))
        for ranks in (1, args.ranks):
            command = [sys.executable, __file__, "--side", str(ranks), "--batch-sizes",
                       *map(str, args.batch_sizes), "--new-tokens", str(args.new_tokens),
                       "--prompt-tokens", str(args.prompt_tokens), "--repeats",
                       str(args.repeats), *(["--model", model] if model else [])]
            out = subprocess.run(command, capture_output=True, text=True, check=False)
            if out.returncode:
                sys.exit(f"the {ranks}-rank run failed:\n{out.stderr[-4000:]}")
            line = next(line for line in out.stdout.splitlines() if line.startswith(MARKER))
            sides[ranks] = json.loads(line.removeprefix(MARKER))
    shapes = sides[1]["shapes"]
    expected_reduce = shapes["hidden"] * 4 * (2 * shapes["layers"] + 1)
    print(f"CPU: {cpu_model()}; {name}, float32, {args.prompt_tokens}-token "
          f"prompts, {args.new_tokens} new tokens, median of {args.repeats}")
    print(f"{'batch':>5}  {'TP=1 tok/s':>10}  {f'TP={args.ranks} tok/s':>10}  {'ratio':>6}  "
          f"{'all-reduce B/tok':>16}  {'all-gather B/tok':>16}  same tokens")
    for batch in map(str, args.batch_sizes):
        one, many = sides[1]["batches"][batch], sides[args.ranks]["batches"][batch]
        print(f"{batch:>5}  {one['tokens_per_s']:>10.1f}  {many['tokens_per_s']:>10.1f}  "
              f"{many['tokens_per_s'] / one['tokens_per_s']:>6.2f}  "
              f"{many['all_reduce_bytes_per_token']:>16.0f}  "
              f"{many['all_gather_bytes_per_token']:>16.0f}  "
              f"{one['tokens'] == many['tokens']}")
    print(f"expected per decode token: all-reduce {expected_reduce} B (hidden {shapes['hidden']}"
          f" x 4 B x (2 x {shapes['layers']} layers + 1 embedding)), all-gather "
          f"{shapes['vocab'] * 4} B (vocab {shapes['vocab']} x 4 B of logits)")


if __name__ == "__main__":
    main()
