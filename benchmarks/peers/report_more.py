"""The sections ``benchmarks/cpu_vs_llamacpp.py`` prints after its tokens/s table (time to
first token, batch-1 decode bandwidth, memory, cold start, rows that failed), and the same
numbers for ``--json``."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

#: Rows whose weights are the GGUF's own bytes (their bandwidth is the file's bytes/token).
GGUF_ROWS = ("hwplug-gguf", "hwplug-gguf-eager", "llamacpp")
GIB, MIB = 2**30, 2**20


def print_measures(args: argparse.Namespace, rows: list[Any],
                   measures: dict[str, Any]) -> dict[str, Any]:
    """Print the sections (module docstring) from the rows' results and ``measures``
    (``weights``: :func:`measures.weight_bytes`; ``bandwidth``: the probe's result or why it
    failed; ``cold``: ``{engine label: [seconds or error, ...]}``; ``probes_other_cores``:
    other processes' CPU use during those probes), and each row's ``other_cores``; return
    them as JSON."""
    ran = [row for row in rows if row.result]
    failures = {row.key: row.error for row in rows if row.error}
    if failures:
        print("\nrows that failed (first line of the error):")
        for row in rows:
            if row.error:
                print(f"  {row.label}: {row.error.splitlines()[0]}")
    other = {row.key: row.other_cores for row in rows if row.other_cores is not None}
    print("\nother processes' CPU use, cores on average (this machine's busy time minus the "
          "benchmark's): " + ", ".join([f"{row.label} {other[row.key]:.2f}" for row in rows
                                         if row.key in other]
                                        + [f"probes {measures['probes_other_cores']:.2f}"]))
    return {"failures": failures, "other_cores": {**other,
                                                  "probes": measures["probes_other_cores"]},
            "ttft_s": _print_ttft(ran, args.prompt_tokens),
            "decode_batch1": _print_decode(ran, args, measures["weights"],
                                           measures["bandwidth"]),
            "memory": _print_memory(ran, measures["weights"]),
            "bandwidth": measures["bandwidth"], "cold_start_s": _print_cold(measures["cold"])}


def _median_ttft(row: Any, length: int) -> float | None:
    run = row.result.get("ttft", {}).get(str(length))
    return statistics.median(run["seconds"]) if run and run["seconds"] else None


def _print_ttft(rows: list[Any], lengths: list[int]) -> dict[str, dict[str, float | None]]:
    found = {row.key: {str(n): _median_ttft(row, n) for n in lengths} for row in rows}
    if not any(v is not None for times in found.values() for v in times.values()):
        return found
    width = max(len(row.label) for row in rows) + 2
    print("\ntime to first token, ms (one prompt, prefill + one greedy token, median):")
    print(f"{'engine':<{width}}" + "".join(f"{str(n) + ' tokens':>12}" for n in lengths))
    for row in rows:
        cells = [found[row.key][str(n)] for n in lengths]
        print(f"{row.label:<{width}}" + "".join(
            f"{'-' if s is None else f'{1000 * s:.0f}':>12}" for s in cells))
    return found


def _print_decode(rows: list[Any], args: argparse.Namespace, weights: dict[str, int],
                  bandwidth: dict[str, Any] | str) -> dict[str, dict[str, float]]:
    """Batch-1 decode tokens/s with prefill taken out: ``(new_tokens - 1) / (call time -
    time to first token of the same prompt length)``, both medians; and the GGUF rows'
    weight bytes per token times that rate."""
    length = args.prompt_tokens[0]
    found: dict[str, dict[str, float]] = {}
    for row in rows:
        batch = row.result["batches"].get("1")
        ttft = _median_ttft(row, length)
        if batch is None or ttft is None or args.new_tokens < 2:
            continue
        seconds = statistics.median(batch["seconds"]) - ttft
        rate = (args.new_tokens - 1) / seconds
        found[row.key] = {"tokens_per_s": rate, "ms_per_token": 1000 / rate}
        if row.key in GGUF_ROWS:
            found[row.key]["weight_gb_s"] = weights["per_token"] * rate / 1e9
    if not found:
        return found
    machine = ("not measured: " + bandwidth if isinstance(bandwidth, str) else
               f"read {bandwidth['read_gb_s']:.1f} GB/s, copy {bandwidth['copy_gb_s']:.1f} "
               f"GB/s (torch, {bandwidth['threads']} threads, "
               f"{bandwidth['bytes'] / GIB:.3g} GiB, best of {bandwidth['repeats']})")
    print(f"\nbatch-1 decode (prefill taken out): weights read per token "
          f"{weights['per_token'] / MIB:.1f} MiB (the GGUF's tensors"
          f"{', the embedding is the LM head' if weights['tied'] else ' but the embedding'}); "
          f"machine: {machine}")
    width = max(len(row.label) for row in rows) + 2
    print(f"{'engine':<{width}}{'tok/s':>9}{'ms/token':>10}{'weight GB/s':>13}"
          f"{'of read bw':>12}")
    for row in rows:
        if row.key not in found:
            continue
        entry = found[row.key]
        gbs = entry.get("weight_gb_s")
        share = ("" if gbs is None or isinstance(bandwidth, str)
                 else f"{gbs / bandwidth['read_gb_s']:.0%}")
        print(f"{row.label:<{width}}{entry['tokens_per_s']:>9.1f}{entry['ms_per_token']:>10.1f}"
              f"{'-' if gbs is None else f'{gbs:.1f}':>13}{share:>12}")
    return found


def _print_memory(rows: list[Any], weights: dict[str, int]) -> dict[str, dict[str, Any]]:
    found = {row.key: {"after_load": row.result.get("rss_after_load_bytes"),
                       "anon": row.result.get("rss_anon_after_load_bytes"),
                       "file": row.result.get("rss_file_after_load_bytes"),
                       "peak": row.result.get("peak_rss_bytes")} for row in rows}
    if not any(v["peak"] for v in found.values()):
        return found
    print(f"\nresident memory of each engine's process (VmRSS after the load, VmHWM at the "
          f"end; the GGUF's tensors: {weights['file'] / GIB:.2f} GiB):")
    width = max(len(row.label) for row in rows) + 2
    for row in rows:
        entry = found[row.key]
        if entry["peak"] is None:
            continue
        split = ("" if entry["anon"] is None or entry["file"] is None else
                 f" (own {entry['anon'] / GIB:.2f} + mapped files {entry['file'] / GIB:.2f})")
        print(f"  {row.label:<{width}}after load {entry['after_load'] / GIB:6.2f} GiB{split}, "
              f"peak {entry['peak'] / GIB:6.2f} GiB ({entry['peak'] / weights['file']:.2f}x "
              f"the tensors)")
    return found


def _print_cold(cold: dict[str, list[float | str]]) -> dict[str, list[float | str]]:
    if cold:
        print("\ncold start to the first token (a fresh process each run, from launch to exit):")
    for label, runs in cold.items():
        shown = [f"run {i}: " + (f"{r:.2f} s" if isinstance(r, float) else f"failed: {r}")
                 for i, r in enumerate(runs, 1)]
        print(f"  {label}: {'; '.join(shown)}")
    return cold
