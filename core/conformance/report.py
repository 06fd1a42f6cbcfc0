"""Rendering a :class:`~hwplug.conformance.result.Report` as a rich table."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from hwplug.conformance.result import Report

_STYLES = {"passed": "green", "failed": "bold red", "skipped": "yellow"}


def report_table(report: Report) -> Table:
    """A table with one row per check: name, status (coloured) and detail."""
    table = Table(title=f"conformance of {report.plugin}", title_justify="left")
    table.add_column("check", overflow="fold")
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    for result in report.results:
        table.add_row(Text(result.check), Text(result.status, style=_STYLES[result.status]),
                      Text(result.detail))
    return table


def print_report(report: Report, console: Console) -> None:
    """Print the table and a one-line verdict."""
    console.print(report_table(report))
    counts = report.counts()
    verdict = "[bold green]PASSED[/]" if report.ok else "[bold red]FAILED[/]"
    console.print(f"{verdict} {report.plugin}: {counts['passed']} passed, "
                  f"{counts['failed']} failed, {counts['skipped']} skipped")
