"""Print an installed distribution's requirements for this interpreter, one a line.

``python .ci/requires.py DIST [SKIP ...]``: the requirements of DIST whose markers hold
here (no extras), without those named SKIP, as ``name<specifier>``. The Makefile's
``setup-ipex`` installs torch and hwplug with ``--no-deps`` and then their requirements
from this list, so that it chooses what to leave out and can fetch one at a time.
"""

from __future__ import annotations

import importlib.metadata
import sys

from packaging.requirements import Requirement


def main(dist: str, *skip: str) -> None:
    for requirement in map(Requirement, importlib.metadata.requires(dist) or []):
        if requirement.name in skip or not (
                requirement.marker is None or requirement.marker.evaluate({"extra": ""})):
            continue
        print(f"{requirement.name}{requirement.specifier}")


if __name__ == "__main__":
    main(*sys.argv[1:])
