"""What ``benchmarks/cpu_vs_llamacpp.py`` prints, and the same numbers as one JSON object."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from gguf import GGUFReader

import hwplug

#: (hwplug row, peer row) pairs whose tokens/s ratio is printed.
RATIOS = (("hwplug-gguf", "llamacpp"), ("hwplug-gguf", "hwplug-gguf-eager"),
          ("hwplug-fp32", "llamacpp-f32"),
          ("hwplug-fp32", "vllm-fp32"), ("hwplug-bf16", "vllm-bf16"),
          ("hwplug-fp32", "transformers-fp32"))
#: The rows whose completions the others are compared with: the first that ran.
REFERENCE_ROWS = ("hwplug-fp32", "llamacpp")
MIB = 2**20


def print_report(args: argparse.Namespace, rows: list[Any], gguf: Path, model_label: str,
                 tokenizer: Any, check_prompt: list[int],
                 load_average: tuple[float, float]) -> dict[str, Any]:
    """Print the host, the table, the ratios, weight memory and the completions (of
    ``check_prompt`` and the first timed call; compared with hwplug fp32's, else
    llama.cpp's, where that row ran); return all of it (and every row's raw result) for
    ``--json``. The sections after these: :mod:`report_more`."""
    facts = hwplug.current_platform().facts
    host = {"cpu": facts.device_name, "features": sorted(facts.features),
            "torch": torch.__version__, "threads": args.threads,
            "load_average": {"start": load_average[0], "end": load_average[1]}}
    print(f"\nCPU {host['cpu']} (features: {' '.join(host['features'])}), torch "
          f"{host['torch']}, {args.threads} threads per engine; load average "
          f"{load_average[0]:.2f} at start, {load_average[1]:.2f} at end")
    print(f"{model_label}, {args.prompt_tokens[0]}-token prompts, {args.new_tokens} new "
          f"tokens, greedy, EOS ignored; generated tokens/s end to end (prefill included), "
          f"median of {args.repeats}")
    batches = [str(batch) for batch in args.batch_sizes]
    by_key = {row.key: row for row in rows}
    _print_table(rows, batches)
    ratios = _print_ratios(by_key, batches)
    memory = _print_weight_memory(by_key.get("hwplug-gguf"), gguf)
    reference = next((by_key[key] for key in REFERENCE_ROWS
                      if key in by_key and by_key[key].result), None)
    completions = _print_completions(rows, reference, batches[0],
                                     tokenizer.decode(check_prompt), tokenizer)
    preempted = {row.key: row.result["engine"]["preemptions"] for row in rows
                 if row.result and row.result["engine"].get("preemptions")}
    if preempted:
        print(f"warning: hwplug preempted sequences (KV cache too small): {preempted}")
    return {"host": host, "settings": {k: str(v) if isinstance(v, Path) else v
                                       for k, v in vars(args).items()},
            "rows": {row.key: _row_json(row) for row in rows}, "ratios": ratios,
            "weight_memory": memory, "completions": completions}


def _print_table(rows: list[Any], batches: list[str]) -> None:
    width = max(len(row.label) for row in rows) + 2
    print(f"{'engine':<{width}}" + "".join(f"{'batch ' + b:>10}" for b in batches)
          + f"{'load s':>9}{'warm-up s':>11}")
    for row in rows:
        if row.result is None:
            print(f"{row.label:<{width}}{'skipped' if row.skip else 'failed':>10}")
            continue
        speeds = row.result["tokens_per_s"]
        first = row.result["batches"][batches[0]]
        print(f"{row.label:<{width}}" + "".join(f"{speeds[b]:>10.1f}" for b in batches)
              + f"{row.result['load_s']:>9.1f}{first['warmup_s']:>11.1f}")
    print("load s: the engine's start (vLLM: with its compilation); warm-up s: its first "
          f"call at batch {batches[0]}; neither is in tokens/s")


def _print_ratios(by_key: dict[str, Any], batches: list[str]) -> dict[str, dict[str, float]]:
    ratios: dict[str, dict[str, float]] = {}
    lines = []
    for ours, theirs in RATIOS:
        if not all(key in by_key and by_key[key].result for key in (ours, theirs)):
            continue
        a, b = by_key[ours].result["tokens_per_s"], by_key[theirs].result["tokens_per_s"]
        ratios[f"{ours} / {theirs}"] = {batch: a[batch] / b[batch] for batch in batches}
        label = f"{by_key[ours].label} / {by_key[theirs].label}"
        lines.append((label, ratios[f"{ours} / {theirs}"]))
    if lines:
        width = max(len(label) for label, _ in lines) + 2
        print(f"\n{'ratio (above 1: hwplug faster)':<{width}}"
              + "".join(f"{'batch ' + b:>10}" for b in batches))
        for label, values in lines:
            print(f"{label:<{width}}" + "".join(f"{values[b]:>9.2f}x" for b in batches))
    return ratios


def _print_weight_memory(row: Any, gguf: Path) -> dict[str, int] | None:
    file_bytes = sum(int(tensor.n_bytes) for tensor in GGUFReader(gguf).tensors)
    if row is None or row.result is None:
        print(f"\nweight memory: not measured (the hwplug-gguf row did not run); the GGUF's "
              f"tensors take {file_bytes / MIB:.1f} MiB")
        return None
    resident = row.result["engine"]["weight_bytes"]
    print(f"\nresident weights of hwplug's GGUF-kept model (parameters and buffers): "
          f"{resident / MIB:.1f} MiB, {resident / file_bytes:.2f}x the GGUF's tensor bytes "
          f"({file_bytes / MIB:.1f} MiB)")
    return {"resident_bytes": resident, "gguf_tensor_bytes": file_bytes}


def _print_completions(rows: list[Any], reference: Any, batch: str, check_text: str,
                       tokenizer: Any) -> dict[str, dict[str, Any]]:
    """Each row's completion of the check prompt (text that should read as text) and how
    many of its leading tokens, and of its first timed completion at the smallest batch
    (the same prompt for all rows), match the reference row's."""
    def completions(row: Any) -> tuple[list[int], list[int]]:
        return row.result["check_completion"], row.result["batches"][batch]["first_completion"]

    expected = completions(reference) if reference is not None and reference.result else None
    found: dict[str, dict[str, Any]] = {}
    print(f"\ncompletions of {check_text!r}"
          + (f"; leading tokens equal to {reference.label}'s, of it and of the first timed "
             f"completion at batch {batch}" if expected else ""))
    for row in (row for row in rows if row.result):
        check, timed = completions(row)
        same = None if expected is None else [
            _leading_equal(ours, theirs) for ours, theirs in zip((check, timed), expected,
                                                                 strict=True)]
        found[row.key] = {"check_tokens": check, "check_text": tokenizer.decode(check),
                          "timed_tokens": timed, "leading_tokens_equal": same}
        counts = ("" if same is None
                  else f"{same[0]:>3}/{len(check)} {same[1]:>3}/{len(timed)}  ")
        print(f"  {row.label}: {counts}{found[row.key]['check_text'][:80]!r}")
    return found


def _leading_equal(ours: list[int], theirs: list[int]) -> int:
    """How many leading tokens of two completions of one length are equal."""
    return next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b),
                len(ours))


def _row_json(row: Any) -> dict[str, Any]:
    status = "ok" if row.result else "skipped" if row.skip else "failed"
    return {"label": row.label, "status": status, "skip": row.skip, "error": row.error,
            "options": row.options, "env": row.env, **(row.result or {})}
