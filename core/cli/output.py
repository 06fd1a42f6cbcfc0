"""Shared helpers for CLI output: a JSON flag and rich tables from rows."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from hwplug.dtypes import AUTO, FLOAT_DTYPES, FP8_KV_DTYPES


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def add_dtype_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", choices=(AUTO, *FLOAT_DTYPES), default=AUTO,
                        help="compute dtype (default: auto, the platform's best dtype that "
                             "the checkpoint allows)")


def add_kv_cache_flags(parser: argparse.ArgumentParser) -> None:
    """``--kv-cache-dtype`` and ``--calculate-kv-scales`` (see ``hwplug.LLM``)."""
    parser.add_argument("--kv-cache-dtype", choices=(*FLOAT_DTYPES, *FP8_KV_DTYPES),
                        help="the KV cache's dtype (default: the compute dtype)")
    parser.add_argument("--calculate-kv-scales", choices=("tensor", "head"),
                        help="for an fp8 cache: compute k/v scales from the first batch, per "
                             "tensor or per KV head (default: the checkpoint's, else 1)")


def print_json(console: Console, data: Any) -> None:
    console.print_json(json.dumps(data, default=str))


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    result = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        result.add_column(column, overflow="fold")
    for row in rows:
        result.add_row(*("" if cell is None else str(cell) for cell in row))
    return result
