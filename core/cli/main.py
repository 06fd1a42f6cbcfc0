"""The ``hwplug`` command: one subcommand per module in :mod:`hwplug.cli`.

Any error ends the command with one line on stderr (exit status 2; 1 for an error hwplug
did not expect, which is worth a bug report); ``--debug`` or ``HWPLUG_DEBUG=1`` adds the
traceback.

Run as the ``hwplug`` program (:func:`main` without ``argv``), a command that ran a model
(:data:`RUNS_MODELS`) ends the process as soon as its output is flushed and the ``atexit``
handlers ran (:func:`exit_promptly`): tearing down the interpreter's modules and a loaded
model's memory would add a second or more to every start and change nothing; the garbage
collector is paused while it loads the model (:mod:`hwplug.cli.startup`).
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from rich.console import Console
from rich.markup import escape

from hwplug import envs
from hwplug.cli import startup
from hwplug.errors import ConfigError, HwplugError

#: Subcommands that run a model: the platform's process environment is applied first.
RUNS_MODELS = ("generate", "embed", "serve")
#: subcommand -> (module, help). Each module defines ``add_arguments(parser)`` and
#: ``run(args, console) -> int``.
COMMANDS = {
    "info": ("hwplug.cli.info", "show the resolved platform, plugins, registries, settings"),
    "kernels": ("hwplug.cli.kernels", "show the kernel variant chosen per op and why"),
    "build": ("hwplug.cli.build", "build the native kernel libraries this machine can use, "
                                  "ahead of time"),
    "models": ("hwplug.cli.models", "list registered model architectures"),
    "generate": ("hwplug.cli.generate", "generate text with a model"),
    "embed": ("hwplug.cli.embed", "embed text with an encoder model"),
    "serve": ("hwplug.cli.serve", "serve a model over an OpenAI-compatible HTTP API"),
    "convert": ("hwplug.cli.convert", "write a model as float Hugging Face safetensors"),
    "conformance": ("hwplug.cli.conformance", "run the conformance kit against a plugin"),
    "new-plugin": ("hwplug.cli.new_plugin", "write a new hardware plugin package"),
}


def _add_debug_flag(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument("--debug", action="store_true", default=default,
                        help="print the traceback of an error (also HWPLUG_DEBUG=1)")


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are :class:`ConfigError` (one line, status 2)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.prog}: {message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hwplug", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_debug_flag(parser, False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        _add_debug_flag(command, argparse.SUPPRESS)  # accepted after the subcommand too
        command.set_defaults(module=module_name)
        importlib.import_module(module_name).add_arguments(command)
    return parser


def _print_error(console: Console, exc: BaseException, expected: bool, debug: bool) -> int:
    """One line naming the error (and the traceback when debugging); the exit status."""
    if debug:
        console.print("".join(traceback.format_exception(exc)), markup=False,
                      highlight=False, end="")
    kind = type(exc).__name__ if expected else f"internal error ({type(exc).__name__})"
    hint = "" if expected or debug else " (run with --debug for the traceback)"
    console.print(f"[bold red]error:[/] {escape(kind)}: {escape(str(exc))}{hint}",
                  highlight=False, soft_wrap=True)
    return 2 if expected else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default: the program's arguments) and return its exit
    status; without ``argv`` a command in :data:`RUNS_MODELS` ends the process instead
    (:func:`exit_promptly`)."""
    console = Console(stderr=True)
    program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    command = None
    try:
        debug = debug or envs.HWPLUG_DEBUG
        logging.basicConfig(level=envs.HWPLUG_LOG_LEVEL.upper(),
                            format="%(levelname)s %(name)s: %(message)s")
        args = build_parser().parse_args(argv)
        command = args.command
        if command in RUNS_MODELS:
            from hwplug import current_platform

            if program:
                startup.pause_gc()  # until the command's model is loaded

            current_platform().apply_process_env()
        code = importlib.import_module(args.module).run(args, Console())
    except HwplugError as exc:
        code = _print_error(console, exc, expected=True, debug=debug)
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:
        code = _print_error(console, exc, expected=False, debug=debug)
    if program and command in RUNS_MODELS:
        exit_promptly(code)
    return code


def exit_promptly(code: int) -> NoReturn:
    """End the process with status ``code`` now: flush stdout and stderr, run the
    ``atexit`` handlers (logging's flush among them), then ``os._exit``, skipping the
    interpreter's teardown (freeing every module and a model's weights one by one)."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: Python's own exit says 120 then
            code = code or 120
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
