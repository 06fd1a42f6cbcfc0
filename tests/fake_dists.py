"""Real installed distributions for discovery tests: ``*.dist-info`` folders on sys.path.

Each fake distribution is a folder with METADATA and entry_points.txt plus its module
files, exactly what pip would leave behind, so discovery runs its real code path.
:func:`add_platform` installs a small platform plugin of the shape discovery tests need.
"""

from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path


class FakeSite:
    """A temporary site directory; call :meth:`add` per distribution."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.tag = uuid.uuid4().hex[:8]

    def module(self, name: str) -> str:
        """A module name unique to this site, so repeated tests never share sys.modules."""
        return f"{name}_{self.tag}"

    def add(self, dist: str, entry_points: dict[str, dict[str, str]],
            modules: dict[str, str], version: str = "1.0") -> None:
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        lines = []
        for group, eps in entry_points.items():
            lines.append(f"[{group}]")
            lines.extend(f"{name} = {value}" for name, value in eps.items())
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        for module, source in modules.items():
            (self.root / f"{module}.py").write_text(textwrap.dedent(source))


def activate_site(site: FakeSite, monkeypatch) -> None:
    """Put ``site`` first on sys.path for the test (undone by monkeypatch)."""
    monkeypatch.syspath_prepend(str(site.root))
    sys.path_importer_cache.clear()


PLATFORM_SRC = """
from hwplug.platform_interface import Platform
from hwplug.platforms.sighting import Activation, Sighting

class {cls}(Platform):
    name = "{name}"
    device_type = "cpu"
    vendor = "acme"
    families = {families}
    is_accelerator = {accel}
    priority = {priority}
    supported_dtypes = ("float32",)
    supported_kv_cache_dtypes = ("float32",)
    attention_backend_priority = ("REFERENCE",)

    def is_available(self):
        return {available}

def activate():
    return {result}
"""

#: An activate() answering with a sighting (the probe's facts reach the platform).
SIGHTING_RESULT = (
    'Activation(__name__ + ":Plat", Sighting("acme", "{name}", None, "acme-{name}", '
    '("Acme X2",) * 3, 3, "/dev/acme0", {{"features": "fast-math x2"}}))')

GOOD_PLUGIN_SRC = """
from hwplug import hookimpl
from hwplug.kernel_registry.reference import silu_and_mul

hwplug_api_version = ">=1,<2"
seen = []

@hookimpl
def hwplug_register_kernels(registry):
    registry.register_variant("silu_and_mul", "{variant}", silu_and_mul,
                              platforms=("{platform}",), priority=5)

@hookimpl
def hwplug_register_connectors(registry):
    registry.register("{connector}", "hwplug.connector:Connector")

@hookimpl
def hwplug_platform_resolved(platform):
    seen.append(platform.name)
"""


def add_platform(site: FakeSite, name: str, *, accel: bool = True, priority: int = 0,
                 active: bool = True, available: bool = True, sighting: bool = False,
                 families: tuple[str, ...] = (), plugin_src: str | None = None
                 ) -> dict[str, str]:
    """A distribution ``acme-<name>`` with a platform entry point (answering a plain
    ``"module:Class"``, or with ``sighting`` an ``Activation`` with a sighting of three
    "Acme X2" devices) and optionally a plugin."""
    mod = site.module(f"acme_{name.replace('-', '_')}")
    result = ("None" if not active else SIGHTING_RESULT.format(name=name) if sighting
              else f'"{mod}:Plat"')
    modules = {mod: PLATFORM_SRC.format(cls="Plat", name=name, accel=accel,
                                        priority=priority, result=result,
                                        available=available, families=families)}
    eps = {"hwplug.platforms": {name: f"{mod}:activate"}}
    if plugin_src is not None:
        modules[mod + "_plugin"] = plugin_src
        eps["hwplug.plugins"] = {name: mod + "_plugin"}
    site.add(f"acme-{name}", eps, modules)
    return {"platform": mod, "plugin": mod + "_plugin"}


def good_plugin(site: FakeSite, platform: str) -> str:
    return GOOD_PLUGIN_SRC.format(variant=site.module("fast_silu"), platform=platform,
                                  connector=site.module("conn"))
