"""Greedy tokens of the GGUF-kept model against the dequantized fp32 model, side by side.

The default model (SmolLM2-135M-Instruct's Q4_1 GGUF) loaded twice in one process: its
GGUF blocks kept (the C kernel's integer dots, activations quantized per block of 32) and
dequantized to float32. Each of 20 prompts is completed greedily for ``--tokens`` tokens
(32, EOS ignored) by both; a prompt agrees when every token is the same. Printed: the
count of agreeing prompts and, for the others, the first position that differs; and the
largest difference between the two models' log-probabilities of the first generated
token's 5 most likely tokens (the logits' difference, less their log-sum-exp's).
``--int8`` runs the GGUF model with int8 activations for every type (llama.cpp's
precision) through a user tuning table, instead of hwplug's tuned choice. ``--models``
checks other GGUF files instead, one after the other (e.g. SmolLM2 re-quantised to each
type by ``benchmarks/make_gguf.py --smollm2``), a summary line each.

    python benchmarks/gguf_greedy_agreement.py [--tokens 32] [--int8] [--models A.gguf ...]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import hwplug

hwplug.current_platform().apply_process_env()  # before torch loads, as `hwplug generate`

PROMPTS = (
    "The capital of France is", "Write a haiku about the sea.", "What is 17 times 23?",
    "Explain photosynthesis to a child.", "List three uses of copper.",
    "Once upon a time, in a small village,", "The best way to learn a language is",
    "Translate 'good morning' into Spanish.", "Why is the sky blue?",
    "Give me a recipe for pancakes.", "def fibonacci(n):", "The French Revolution began in",
    "Summarize the plot of Romeo and Juliet.", "What are the planets of the solar system?",
    "A good name for a black cat is", "How do vaccines work?",
    "Write a short email asking for a meeting.", "The largest ocean on Earth is",
    "What does a compiler do?", "Describe a sunset in one sentence.",
)


def int8_table(directory: Path) -> None:
    """A user ``ggml_linear`` table in ``directory``: int8 activations for every type."""
    from gguf import GGMLQuantizationType

    from hwplug.kernel_registry.reference.ggml import QUANTIZED_TYPES
    from hwplug.kernel_registry.tuning import read_layer
    from hwplug.platforms.cpu.ggml.ops import TUNING

    names = [GGMLQuantizationType(kind).name for kind in QUANTIZED_TYPES]
    entry = {"activations": dict.fromkeys(names, "int8")}
    buckets = read_layer(TUNING)["default"]
    (directory / "ggml_linear.json").write_text(
        json.dumps({"default": dict.fromkeys(buckets, entry)}))


def completions(llm: hwplug.LLM, tokens: int) -> tuple[list[list[int]], list[dict]]:
    """Each prompt's greedy token ids, and its first token's top-5 {token: logprob}."""
    params = hwplug.SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True,
                                   logprobs=5)
    outputs = llm.generate(list(PROMPTS), params)
    return ([list(out.token_ids) for out in outputs],
            [{t: p.logprob for t, p in out.outputs[0].logprobs[0].items()} for out in outputs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--int8", action="store_true",
                        help="int8 activations for every GGUF type (llama.cpp's precision)")
    parser.add_argument("--models", nargs="+", default=[None],
                        help="GGUF files to check (default: the packaged SmolLM2 Q4_1)")
    args = parser.parse_args()
    platform = hwplug.current_platform()
    print(f"CPU: {platform.facts.device_name}; {len(PROMPTS)} prompts x {args.tokens} greedy "
          f"tokens; GGUF activations: {'int8 (user table)' if args.int8 else 'hwplug tuned'}")
    with tempfile.TemporaryDirectory() as scratch:
        if args.int8:
            int8_table(Path(scratch))
            os.environ["HWPLUG_TUNING_DIR"] = scratch
        for model in args.models:
            compare(model, args.tokens)


def compare(model: str | None, tokens: int) -> None:
    """Print how ``model`` (None: the default) kept quantised agrees with it dequantised."""
    kept = hwplug.LLM(model)
    quantized, kept_logprobs = completions(kept, tokens)
    kept.close()
    dense = hwplug.LLM(model, dequantize=True, dtype="float32")
    reference, dense_logprobs = completions(dense, tokens)
    dense.close()
    gap = max(abs(got[t] - want[t]) for got, want in zip(kept_logprobs, dense_logprobs,
                                                          strict=True)
              for t in got.keys() & want.keys())
    print(f"{Path(model).name if model else 'default model'}:")
    differ = []
    for prompt, got, want in zip(PROMPTS, quantized, reference, strict=True):
        if got != want:
            first = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
            differ.append(f"  {prompt!r}: first differs at token {first}")
    print(f"GGUF kept == dequantized fp32 on {len(PROMPTS) - len(differ)} of {len(PROMPTS)} "
          f"prompts", *differ, sep="\n")
    print(f"first token's top-5 log-probabilities: largest |GGUF kept - fp32| {gap:.4f}")


if __name__ == "__main__":
    main()
