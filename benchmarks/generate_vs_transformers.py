"""Decode speed: ``hwplug.LLM.generate`` vs transformers ``generate`` on the same weights.

SmolLM2-135M-Instruct is loaded once by hwplug; transformers' ``LlamaForCausalLM`` is
built from the same config and given the same state dict, in the same dtype: a GGUF is
dequantised for both sides (``dequantize=True``; hwplug would otherwise keep its blocks,
which ``benchmarks/cpu_vs_llamacpp.py`` measures). For each batch size, both generate
greedily from the same random prompts and ignore EOS. Decode tokens/s is
``batch * (N - 1) / (T(N) - T(1))`` where ``T(n)`` is the wall time of a generate call for
``n`` new tokens, so prefill is excluded alike for both. Calls alternate between the two
sides and the median of ``--repeats`` is kept, so load from other processes hits both
alike.

    python benchmarks/generate_vs_transformers.py                   # batch 1, 8, 32
    python benchmarks/generate_vs_transformers.py --batch-sizes 1 --new-tokens 128
    python benchmarks/generate_vs_transformers.py --dtype bfloat16 --batch-sizes 1 32 128  # GPU
    python benchmarks/generate_vs_transformers.py --eager-row   # also hwplug without graphs

``--eager-row`` adds a second hwplug engine with ``step_graphs=False`` (every decode step
runs its Python, where the first replays recorded steps: the CPU's native calls, CUDA
graphs on hwplug-cuda) and reports whether both give the same greedy tokens, else where
they first differ.

Both sides run on the resolved platform's device (transformers' model is moved there),
in one process with the platform's process environment (``Platform.process_env``, e.g.
``GOMP_SPINCOUNT`` on CPUs), applied as ``hwplug generate`` does before torch loads.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable

import hwplug

hwplug.current_platform().apply_process_env()  # before torch loads; both sides share it

import torch  # noqa: E402

from hwplug.model_zoo.engine.decode_graphs import RECORD_AT  # noqa: E402
from hwplug.model_zoo.loaders import load_checkpoint, resolve_model  # noqa: E402
from hwplug.model_zoo.loaders.resolve import checkpoint_format  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="path or alias (default: the default model)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=64, help="N new tokens per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="tokens per prompt")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls of each side")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--eager-row", action="store_true",
                        help="also time hwplug with step_graphs=False")
    return parser.parse_args()


def is_gguf(model: str | None) -> bool:
    """Whether ``model`` names a GGUF file (its weights are then dequantised for both)."""
    return checkpoint_format(resolve_model(model)) == "gguf"


def transformers_model(model: str | None, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' Llama with the checkpoint's weights, as hwplug loads them."""
    from transformers import AutoModelForCausalLM

    checkpoint = load_checkpoint(resolve_model(model), dequantize=is_gguf(model))
    reference = AutoModelForCausalLM.from_config(checkpoint.transformers_config(),
                                                 dtype=dtype).eval()
    result = reference.load_state_dict(dict(checkpoint.weights()), strict=False)
    if result.unexpected_keys or set(result.missing_keys) - {"lm_head.weight"}:
        raise RuntimeError(f"weights do not match transformers' model: {result}")
    reference.tie_weights()
    return reference


def seconds(generate: Callable[[int], object], new_tokens: int) -> float:
    synchronize()
    start = time.perf_counter()
    generate(new_tokens)
    synchronize()
    return time.perf_counter() - start


def synchronize() -> None:
    """Wait for queued GPU work, so wall time covers it (no-op without CUDA)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def decode_rates(sides: dict[str, Callable[[int], object]], batch: int, new_tokens: int,
                 repeats: int) -> dict[str, float]:
    """Median decode tokens/s of each side, timed in alternating order."""
    for generate in sides.values():  # warm-up: past the step that records a step graph
        generate(RECORD_AT + 2)
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for repeat in range(repeats):
        order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
        for name in order:
            full, prefill = seconds(sides[name], new_tokens), seconds(sides[name], 1)
            rates[name].append(batch * (new_tokens - 1) / (full - prefill))
    return {name: statistics.median(values) for name, values in rates.items()}


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    options = {"dtype": args.dtype, "max_num_seqs": max(args.batch_sizes),
               "dequantize": is_gguf(args.model)}
    llm = hwplug.LLM(args.model, **options)
    eager = hwplug.LLM(args.model, step_graphs=False, **options) if args.eager_row else None
    device = llm.ctx.device
    reference = transformers_model(args.model, getattr(torch, args.dtype)).to(device)
    vocab = llm.hf_config.vocab_size
    generator = torch.Generator().manual_seed(0)
    print(f"model {llm.architecture}, dtype {args.dtype}, platform {llm.platform}, attention "
          f"{llm.attention_backend}, step graphs {llm.config.step_graphs}, "
          f"{torch.get_num_threads()} threads, GOMP_SPINCOUNT="
          f"{os.environ.get('GOMP_SPINCOUNT', 'unset')}, {args.new_tokens} new "
          f"tokens after {args.prompt_tokens}-token prompts; decode tokens/s (median of "
          f"{args.repeats})")
    eager_head = f" {'hwplug eager':>13} {'graphs/eager':>13}" if eager else ""
    print(f"{'batch':>5} {'hwplug':>10} {'transformers':>13} {'ratio':>7}{eager_head}")
    for batch in args.batch_sizes:
        prompts = torch.randint(0, vocab, (batch, args.prompt_tokens), generator=generator)
        token_lists = prompts.tolist()
        prompts = prompts.to(device)

        def ours(new_tokens: int, token_lists: list[list[int]] = token_lists,
                 engine: hwplug.LLM = llm) -> list:
            sampling = hwplug.SamplingParams(max_tokens=new_tokens, ignore_eos=True)
            return engine.generate(token_lists, sampling)

        def theirs(new_tokens: int, prompts: torch.Tensor = prompts) -> object:
            with torch.inference_mode():
                return reference.generate(prompts, attention_mask=torch.ones_like(prompts),
                                          max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                          do_sample=False, pad_token_id=0)

        sides = {"hwplug": ours, "transformers": theirs}
        if eager is not None:
            sides["eager"] = functools.partial(ours, engine=eager)
        rates = decode_rates(sides, batch, args.new_tokens, args.repeats)
        row = (f"{batch:>5} {rates['hwplug']:>10.1f} {rates['transformers']:>13.1f} "
               f"{rates['hwplug'] / rates['transformers']:>6.2f}x")
        if eager is not None:
            agree = agreement(token_ids(ours(args.new_tokens)),
                              token_ids(sides["eager"](args.new_tokens)))
            row += f" {rates['eager']:>13.1f} {rates['hwplug'] / rates['eager']:>12.2f}x ({agree})"
        print(row, flush=True)
    print(llm.runner.graphs.describe() if llm.runner.graphs else "step graphs: off")


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> str:
    """Whether two engines generated the same greedy tokens, else where they first differ."""
    first = [next(i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b)
             for x, y in zip(ours, theirs, strict=True) if x != y]
    if not first:
        return "greedy tokens identical"
    return (f"greedy tokens differ in {len(first)} of {len(ours)} sequences, first at token "
            f"{min(first)}, median {statistics.median(first)}")


def token_ids(outputs: list) -> list[list[int]]:
    """The generated token ids of each request of a ``generate`` call."""
    return [list(output.outputs[0].token_ids) for output in outputs]


if __name__ == "__main__":
    main()
