"""``hwplug generate``: complete one prompt (streamed to stdout) or a file of prompts (batched).

After the text, stderr gets one line of speed (tokens/s, time to first token), the
platform's execution summary when it gives one (e.g. JIT compilations), one line on step
graphs (the decode batch sizes replayed and how many steps were; the sizes that ran
eagerly and why; ``off``), under ``--speculative-config`` one line of its acceptance rate
and mean accepted length (tokens per verify step), and one line of
where it ran: the platform, the attention backend, the dtype and KV-cache dtype, the
weights' quantization method (``gguf``, ``fp8``, ``unquantized``...), the parallelism
(``tensor-parallel 2``) and the kernel variants that served each op the run called (rank
0's under tensor parallelism; a torchrun rank > 0 prints nothing). Bad input (a missing
model, an invalid sampling value) is a :class:`~hwplug.errors.HwplugError`, printed by
``hwplug`` without a traceback. The engine's flags are generated from ``LLM``'s options
(:mod:`hwplug.cli.llm_flags`); ``--verbose`` first prints the resolved configuration.
The run is one batch, so unless ``--max-num-seqs`` is given it runs as many sequences at
once as there are prompts (at most the option's default), and the KV cache is sized for
that many (see ``LLM``'s ``num_kv_blocks``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from hwplug.cli.inputs import path_name, read_text_file, utf8_text
from hwplug.cli.llm_flags import add_llm_flags, declared_default, llm_options
from hwplug.cli.output import table
from hwplug.cli.startup import model_loaded
from hwplug.errors import ConfigError

if TYPE_CHECKING:
    from hwplug import LLM, SamplingParams


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", nargs="?", type=utf8_text,
                        help="the prompt (or use --prompts-file)")
    parser.add_argument("--prompts-file", type=path_name,
                        help="generate for every line of this file, as one batch")
    parser.add_argument("--chat", action="store_true",
                        help="wrap each prompt as a user message in the model's chat template")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens at most")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0, help="sample from the k most likely "
                                                              "tokens (0 = all)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    parser.add_argument("--stop", nargs="+", default=[], metavar="STR", type=utf8_text,
                        help="stop when the text reaches one of these strings")
    parser.add_argument("--verbose", action="store_true",
                        help="also print the resolved configuration (options and what the "
                             "platform settled) on stderr")
    add_llm_flags(parser)


def run(args: argparse.Namespace, console: Console) -> int:
    from hwplug import LLM, SamplingParams

    if (args.prompt is None) == (args.prompts_file is None):
        raise ConfigError("give either a prompt or --prompts-file (one of them)")
    prompts = [args.prompt] if args.prompts_file is None else _read_prompts(args.prompts_file)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                              top_k=args.top_k, top_p=args.top_p, stop=tuple(args.stop))
    options = llm_options(args)
    default_seqs = declared_default("max_num_seqs")
    options.setdefault("max_num_seqs", min(len(prompts), default_seqs))
    llm = LLM(**options)
    model_loaded()
    if llm.parallelism.is_worker:  # a torchrun rank > 0: it served rank 0, which prints
        return 0
    if args.verbose:
        print_resolved(llm, Console(stderr=True))
    inputs = [llm.apply_chat_template(p) if args.chat else llm.tokenize(p) for p in prompts]
    if args.prompts_file is None:
        num_tokens, seconds, first_token = _stream(llm, inputs[0], sampling, console)
    else:
        num_tokens, seconds, first_token = _batch(llm, prompts, inputs, sampling, console)
    _report(llm, num_tokens, seconds, first_token, Console(stderr=True))
    return 0


def print_resolved(llm: LLM, console: Console) -> None:
    """The configuration ``llm`` runs with (settled values, then the options given), how
    its weights are held (which, if any, dequantized and why) and the kernel plan its
    layers bound."""
    from hwplug.model_zoo.loaders.memory import format_bytes
    from hwplug.model_zoo.plan_report import layer_kernels

    settled = llm.config.describe()
    given = settled.pop("options")
    console.print(table("resolved configuration", ("setting", "value"),
                        [*settled.items(), *((f"option {k}", v) for k, v in given.items())]))
    console.print(table("weights (how the model holds them)",
                        ("held as", "tensors", "bytes", "where", "why"),
                        [(g.held_as, g.count, format_bytes(g.nbytes), g.where, g.why)
                         for g in llm.weights]))
    console.print(table("kernel plan (bound when the model was built; '>' falls back per "
                        "call, [a, b) is a token range)", ("layers", "op", "variants"),
                        layer_kernels(llm.model)))


def _read_prompts(file: Path) -> list[str]:
    prompts = [line for line in read_text_file(file, "--prompts-file").splitlines()
               if line.strip()]
    if not prompts:
        raise ConfigError(f"--prompts-file {file} holds no prompt (one per non-empty line)")
    return prompts


def _stream(llm: LLM, prompt: list[int], sampling: SamplingParams,
            console: Console) -> tuple[int, float, float | None]:
    """Print the completion as it is produced; (tokens, seconds, time to first text)."""
    start = time.perf_counter()
    first_text = None
    stream = llm.stream(prompt, sampling)
    for piece in stream:
        first_text = first_text or time.perf_counter() - start
        console.print(piece, end="", markup=False, highlight=False, soft_wrap=True)
    console.print()
    num_tokens = len(stream.output.token_ids) if stream.output else 0
    return num_tokens, time.perf_counter() - start, first_text


def _batch(llm: LLM, prompts: list[str], inputs: list[list[int]], sampling: SamplingParams,
           console: Console) -> tuple[int, float, None]:
    """Generate for every prompt at once, then print each prompt and its completion."""
    start = time.perf_counter()
    outputs = llm.generate(inputs, sampling)
    seconds = time.perf_counter() - start
    for index, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        console.rule(f"[{index}] {prompt}", align="left", characters="-")
        console.print(output.text, markup=False, highlight=False, soft_wrap=True)
    return sum(len(output.token_ids) for output in outputs), seconds, None


def _report(llm: LLM, num_tokens: int, seconds: float, first_text: float | None,
            console: Console) -> None:
    speed = f"{num_tokens} tokens in {seconds:.2f} s: {num_tokens / seconds:.1f} tokens/s"
    if first_text is not None and num_tokens > 1 and seconds > first_text:
        speed += (f"; first text after {first_text:.2f} s, then "
                  f"{(num_tokens - 1) / (seconds - first_text):.1f} tokens/s")
    console.print(speed, highlight=False)
    summary = llm.ctx.platform.execution_summary()
    if summary:
        console.print(summary, highlight=False)
    graphs = llm.runner.graphs
    console.print(graphs.describe() if graphs else f"step graphs: {llm.config.step_graphs}",
                  highlight=False, soft_wrap=True)
    if llm.runner.prefill_graphs is not None:
        console.print(llm.runner.prefill_graphs.describe(), highlight=False, soft_wrap=True)
    if llm.runner.device_sampling is not None:
        console.print(llm.runner.device_sampling.describe(), highlight=False, soft_wrap=True)
    if llm.config.speculative != "off":
        stats = llm.engine.stats()
        rate, length = stats.acceptance_rate, stats.mean_accepted_length
        console.print(f"speculative decoding ({llm.config.speculative}): "
                      + (f"{stats.spec_accepted_tokens} of {stats.spec_proposed_tokens} "
                         f"proposed tokens accepted ({rate:.0%}), {length:.2f} tokens per "
                         f"verify step" if rate is not None else "nothing proposed"),
                      highlight=False, soft_wrap=True)
    used = ", ".join(f"{name}={'+'.join(sorted(variants))}"
                     for name, variants in llm.ctx.kernels.used().items())
    parallel = llm.parallelism.describe()
    console.print(f"platform {llm.platform}, attention backend {llm.attention_backend}, "
                  f"dtype {llm.dtype}, KV cache {llm.ctx.engine_config.kv_cache_dtype}, "
                  f"weights {llm.ctx.quant_method.get_name()}"
                  f"{', ' + parallel if parallel else ''}; kernels: {used}",
                  highlight=False, soft_wrap=True)
