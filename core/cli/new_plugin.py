"""``hwplug new-plugin NAME [--dir DIR]``: write a hardware plugin package to start from."""

from __future__ import annotations

import argparse

from rich.console import Console

from hwplug.cli.inputs import path_name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="plugin name: lower-case letters and digits, words "
                                     "joined by '-' or '_' (e.g. acme-npu)")
    parser.add_argument("--dir", type=path_name, default=None, metavar="DIR",
                        help="directory to write the package into; must be new or empty "
                             "(default: ./hwplug-NAME)")


def run(args: argparse.Namespace, console: Console) -> int:
    from hwplug.scaffold import create_plugin

    plugin = create_plugin(args.name, args.dir)
    names, root = plugin.names, plugin.root
    console.print(f"[bold]wrote {names.distribution}[/] to {root}:", highlight=False)
    for path in plugin.files:
        console.print(f"  {path.relative_to(root)}", highlight=False, markup=False)
    node = f"/tmp/{names.variant_name}0"
    console.print(
        "\nnext steps:\n"
        f"  pip install -e \"{root}[test]\"\n"
        f"  touch {node}\n"
        f"  {names.device_node_env}={node} hwplug conformance {names.name}\n"
        f"then edit the places marked EDIT (see {root / 'README.md'}).", highlight=False,
        markup=False)
    return 0
