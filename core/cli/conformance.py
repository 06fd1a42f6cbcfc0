"""``hwplug conformance PLUGIN``: run the conformance kit; exit 1 when a check fails."""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import asdict

from rich.console import Console

from hwplug.cli.output import add_json_flag, print_json
from hwplug.errors import HwplugError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plugin", help="entry-point name of the plugin (hwplug.platforms / "
                                       "hwplug.plugins), or cpu / hwplug for the built-ins")
    parser.add_argument("--kernel-examples", type=int, default=20, metavar="N",
                        help="generated inputs per kernel variant (default: 20)")
    parser.add_argument("--attention-examples", type=int, default=4, metavar="N",
                        help="generated batches per attention scenario (default: 4)")
    add_json_flag(parser)


def run(args: argparse.Namespace, console: Console) -> int:
    if importlib.util.find_spec("hypothesis") is None:
        raise HwplugError("the conformance kit draws its inputs with hypothesis, which is not "
                          "installed: pip install hypothesis (or \"hwplug[dev]\")")
    from hwplug.conformance.kit import Budget, run_conformance
    from hwplug.conformance.report import print_report

    budget = Budget(kernel_examples=args.kernel_examples,
                    attention_examples=args.attention_examples)
    with console.status(f"checking {args.plugin}") as status:
        report = run_conformance(args.plugin, budget,
                                 progress=lambda name: status.update(f"checking {name}"))
    if args.json:
        print_json(console, {"plugin": report.plugin, "ok": report.ok,
                             "results": [asdict(r) for r in report.results]})
    else:
        print_report(report, console)
    return 0 if report.ok else 1
