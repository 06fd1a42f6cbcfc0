"""Shared helpers for CLI output: a JSON flag and rich tables from rows."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def print_json(console: Console, data: Any) -> None:
    console.print_json(json.dumps(data, default=str))


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    result = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        result.add_column(column, overflow="fold")
    for row in rows:
        result.add_row(*("" if cell is None else str(cell) for cell in row))
    return result
