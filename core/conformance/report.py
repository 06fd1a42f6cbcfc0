"""Rendering a :class:`~hwplug.conformance.result.Report` as a rich table."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from hwplug.conformance.result import Report

_STYLES = {"passed": "green", "simulated": "cyan", "failed": "bold red", "skipped": "yellow",
           "not checked": "magenta"}
_VERDICT_STYLES = {"PASSED": "bold green", "FAILED": "bold red", "SIMULATED": "bold cyan",
                   "NOT CHECKED": "bold magenta"}


def report_table(report: Report) -> Table:
    """A table with one row per check: name, status (coloured; a simulated one with what
    stood in for the device) and detail."""
    table = Table(title=f"conformance of {report.plugin}", title_justify="left")
    table.add_column("check", overflow="fold")
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    for result in report.results:
        status = result.status + (f" ({result.simulation})" if result.simulation else "")
        table.add_row(Text(result.check), Text(status, style=_STYLES[result.status]),
                      Text(result.detail))
    return table


def print_report(report: Report, console: Console, require_all: bool = False) -> None:
    """Print the table and the one-line verdict (:meth:`Report.verdict`)."""
    console.print(report_table(report))
    word = report.word()
    rest = report.verdict(require_all).removeprefix(word)
    console.print(Text(word, style=_VERDICT_STYLES[word]) + Text(rest))
