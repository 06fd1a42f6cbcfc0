"""``hwplug models``: the registered architectures and where each came from."""

from __future__ import annotations

import argparse

from rich.console import Console

from hwplug.cli.output import add_json_flag, print_json, table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_flag(parser)


def run(args: argparse.Namespace, console: Console) -> int:
    from hwplug.model_zoo.registry import model_sources

    sources = model_sources()
    if args.json:
        print_json(console, sources)
    else:
        console.print(table("model architectures", ("architecture", "registered from"),
                            sorted(sources.items())))
    return 0
