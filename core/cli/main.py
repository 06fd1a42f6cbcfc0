"""The ``hwplug`` command: one subcommand per module in :mod:`hwplug.cli`."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape

from hwplug import envs
from hwplug.errors import HwplugError

#: Subcommands that run a model: the platform's process environment is applied first.
RUNS_MODELS = ("generate", "embed")
#: subcommand -> (module, help). Each module defines ``add_arguments(parser)`` and
#: ``run(args, console) -> int``.
COMMANDS = {
    "info": ("hwplug.cli.info", "show the resolved platform, plugins, registries, settings"),
    "kernels": ("hwplug.cli.kernels", "show the kernel variant chosen per op and why"),
    "models": ("hwplug.cli.models", "list registered model architectures"),
    "generate": ("hwplug.cli.generate", "generate text with a model"),
    "embed": ("hwplug.cli.embed", "embed text with an encoder model"),
    "conformance": ("hwplug.cli.conformance", "run the conformance kit against a plugin"),
    "new-plugin": ("hwplug.cli.new_plugin", "write a new hardware plugin package"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hwplug", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(module=module_name)
        importlib.import_module(module_name).add_arguments(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    console = Console(stderr=True)
    try:
        logging.basicConfig(level=envs.HWPLUG_LOG_LEVEL.upper(),
                            format="%(levelname)s %(name)s: %(message)s")
        args = build_parser().parse_args(argv)
        if args.command in RUNS_MODELS:
            from hwplug.discovery import current_platform

            current_platform().apply_process_env()
        return importlib.import_module(args.module).run(args, Console())
    except HwplugError as exc:
        console.print(f"[bold red]error:[/] {type(exc).__name__}: {escape(str(exc))}",
                      highlight=False,
                      soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
