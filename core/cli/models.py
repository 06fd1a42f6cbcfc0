"""``hwplug models``: the registered architectures and where each came from."""

from __future__ import annotations

import argparse

from rich.console import Console

from hwplug.cli.output import add_json_flag, print_json, table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_flag(parser)


def model_sources() -> dict[str, str]:
    """Each registered architecture and where it came from (after discovery)."""
    from hwplug import discovery, registries

    discovery.current_platform()
    return {e.name: f"{e.target if isinstance(e.target, str) else e.target.__module__} "
                    f"({e.source})" for e in registries.models.entries() if e.status != "removed"}


def run(args: argparse.Namespace, console: Console) -> int:
    sources = model_sources()
    if args.json:
        print_json(console, sources)
    else:
        console.print(table("model architectures", ("architecture", "registered from"),
                            sorted(sources.items())))
    return 0
