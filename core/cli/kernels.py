"""``hwplug kernels``: per op and dtype, the variant chosen here and why others were not.

Side-effect free: a variant's native library is shown as the registry explains it from its
build status (a remembered build failure rejects the variant, one not built yet is noted
"built on first use"); nothing is compiled here (``hwplug build`` does that).
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from hwplug.cli.inputs import positive_int
from hwplug.cli.output import add_json_flag, print_json, table
from hwplug.dtypes import DTYPE_NAMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_flag(parser)
    parser.add_argument("--op", action="append", help="only this op (repeatable)")
    parser.add_argument("--dtype", action="append", choices=DTYPE_NAMES,
                        help="only this dtype (default: the platform's dtypes)")
    parser.add_argument("--num-tokens", type=positive_int,
                        help="explain for this many tokens")


def collect(ops: list[str] | None = None, dtypes: list[str] | None = None,
            num_tokens: int | None = None) -> dict[str, Any]:
    """The explanation of every requested (op, dtype) on the current platform. An op over a
    paged KV cache is explained for the reference layout under its own name and for every
    other layout one of its variants declares as ``op@LAYOUT``."""
    from hwplug import kernels, registries
    from hwplug.attention_selection import describe_backend
    from hwplug.discovery import current_platform

    platform = current_platform()
    result: dict[str, Any] = {"platform": platform.name, "device_type": platform.device_type,
                              "ops": {}, "attention_backends": {}}
    for op in ops or list(kernels.ops()):
        for key, layout in _layouts(kernels, op):
            for dtype in dtypes or platform.supported_dtypes:
                result["ops"].setdefault(key, {})[dtype] = _explained(
                    kernels.explain(op, platform, platform.device_type, dtype, num_tokens,
                                    layout))
    for name in registries.attention_backends.names():
        try:
            result["attention_backends"][name] = describe_backend(
                registries.attention_backends.get(name))
        except Exception as exc:  # report, don't crash the listing
            result["attention_backends"][name] = {"error": repr(exc)}
    return result


def _layouts(kernels: Any, op: str) -> list[tuple[str, str | None]]:
    """``(row name, layout)`` to explain ``op`` for: itself without a layout, or per layout
    (the reference first) for an op over a paged cache."""
    if kernels.op(op).layout_arg is None:  # unknown op -> error naming the ops
        return [(op, None)]
    from hwplug.kv_cache_layout import ANY_LAYOUT, REFERENCE_LAYOUT

    declared = {name for v in kernels.variants(op) for name in v.layouts} - {ANY_LAYOUT}
    return [(op, REFERENCE_LAYOUT),
            *((f"{op}@{name}", name) for name in sorted(declared - {REFERENCE_LAYOUT}))]


def _explained(why: Any) -> dict[str, Any]:
    return {
        "chosen": why.chosen.name if why.chosen else None,
        "fallbacks": [v.name for v in why.chain[1:]],
        "rejected": why.rejected,
        "notes": why.notes,
        "num_tokens": {v.name: list(v.num_tokens) for v in why.chain if v.num_tokens},
    }


def run(args: argparse.Namespace, console: Console) -> int:
    data = collect(args.op, args.dtype, args.num_tokens)
    if args.json:
        print_json(console, data)
        return 0
    rows = []
    for op, by_dtype in data["ops"].items():
        for dtype, why in by_dtype.items():
            rejected = "; ".join(f"{n}: {r}" for n, r in why["rejected"].items())
            chosen, *fallbacks = (_annotated(name, why)
                                  for name in (why["chosen"] or "NONE", *why["fallbacks"]))
            rows.append((op, dtype, chosen, ", ".join(fallbacks), rejected))
    console.print(table(f"kernels on platform {data['platform']}",
                        ("op", "dtype", "chosen", "fallback order", "rejected (why)"), rows))
    backend_rows = [(name, facts.get("layout"), ", ".join(facts.get("internal_fallbacks", []))
                     or "-", facts.get("error", "")) for name, facts in
                    data["attention_backends"].items()]
    console.print(table("attention backends", ("name", "layout", "internal fallbacks", "error"),
                        backend_rows))
    return 0


def _annotated(name: str, why: dict[str, Any]) -> str:
    """``name``, with the ``[low, high)`` token range it is limited to and its note (e.g.
    "built on first use"), if any."""
    label = name
    if name in why["num_tokens"]:
        low, high = why["num_tokens"][name]
        label = f"{name} (tokens [{low}, {high if high is not None else 'inf'}))"
    note = why["notes"].get(name)
    return f"{label} ({note})" if note else label
