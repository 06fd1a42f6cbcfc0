"""``hwplug conformance PLUGIN``: run the conformance kit.

Exit status: 0 when every check passed on the plugin's device (or had nothing to check), 1
when one failed, 3 when nothing failed but some checks only ran in simulation (Triton's
interpreter, a CPU stand-in, JAX on CPU) or could not run on this machine ("not checked
here": the device, a package or a device feature is absent); ``--require-all`` makes those
a failure. ``--json`` prints :meth:`~hwplug.conformance.result.Report.as_json`.
"""

from __future__ import annotations

import argparse
import importlib.util

from rich.console import Console

from hwplug.cli.inputs import positive_int
from hwplug.cli.output import add_json_flag, print_json
from hwplug.errors import HwplugError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plugin", help="entry-point name of the plugin (hwplug.platforms / "
                                       "hwplug.plugins), its distribution (hwplug-cuda), or "
                                       "cpu / hwplug for the built-ins")
    parser.add_argument("--kernel-examples", type=positive_int, default=20, metavar="N",
                        help="generated inputs per kernel variant (default: 20)")
    parser.add_argument("--attention-examples", type=positive_int, default=4, metavar="N",
                        help="generated batches per attention scenario (default: 4)")
    parser.add_argument("--require-all", action="store_true",
                        help="fail (exit 1) when a check cannot run on the plugin's device "
                             "here (simulated or not checked), instead of exiting 3")
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
        print_json(console, report.as_json(args.require_all))
    else:
        print_report(report, console, args.require_all)
    return report.exit_status(args.require_all)
