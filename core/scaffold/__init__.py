"""``hwplug new-plugin``: write a complete, conformant hardware plugin package to start from.

The template lives in ``template/`` as real files: ``*.tmpl`` files are rendered with
:class:`string.Template` (``${name}``, ``${package}``, ... from :class:`PluginNames`),
and a path part ``__package__`` becomes the import package name. The generated package
``hwplug-<name>`` has a probe, a Platform, one kernel variant, one attention backend,
tests that run the conformance kit, and a README; it passes the kit as generated.
"""

from __future__ import annotations

import logging
import re
import shutil
import string
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from hwplug.errors import ConfigError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

logger = logging.getLogger(__name__)

#: A plugin name: lower-case words of letters and digits joined by single dashes or
#: underscores, starting with a letter (it becomes ``hwplug-<name>`` and ``hwplug_<name>``).
NAME_PATTERN = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")
#: Names the conformance kit and discovery reserve for hwplug's built-ins.
RESERVED_NAMES = ("cpu", "hwplug", "reference")
PACKAGE_PLACEHOLDER = "__package__"
TEMPLATE_SUFFIX = ".tmpl"


@dataclass(frozen=True)
class PluginNames:
    """Every name the template needs, derived from the plugin name ``acme-npu``."""

    name: str  # acme-npu: entry-point and platform name, HWPLUG_PLATFORM value
    distribution: str  # hwplug-acme-npu
    package: str  # hwplug_acme_npu
    platform_class: str  # AcmeNpuPlatform
    backend_class: str  # AcmeNpuAttentionBackend
    backend_name: str  # ACME_NPU_ATTN
    variant_name: str  # acme_npu
    device_node_env: str  # ACME_NPU_DEVICE_NODE
    api_range: str  # >=1,<2
    hwplug_requirement: str  # hwplug>=0.1

    @classmethod
    def from_name(cls, name: str) -> PluginNames:
        """Validate ``name`` and derive the rest; raises :class:`ConfigError` naming the rule."""
        if not NAME_PATTERN.fullmatch(name):
            raise ConfigError(
                f"plugin name {name!r} is not valid: use lower-case letters and digits, "
                "starting with a letter, words joined by '-' or '_' (e.g. 'acme' or 'acme-npu')")
        if name in RESERVED_NAMES:
            raise ConfigError(f"plugin name {name!r} is reserved for hwplug's built-ins; "
                              f"reserved: {', '.join(RESERVED_NAMES)}")
        from hwplug import __version__
        from hwplug.discovery import API_VERSION

        words = re.split(r"[-_]", name)
        camel = "".join(w.capitalize() for w in words)
        snake = "_".join(words)
        major = int(API_VERSION.split(".")[0])
        release = ".".join(__version__.split(".")[:2])
        return cls(name, f"hwplug-{name}", f"hwplug_{snake}", f"{camel}Platform",
                   f"{camel}AttentionBackend", f"{snake.upper()}_ATTN", snake,
                   f"{snake.upper()}_DEVICE_NODE", f">={major},<{major + 1}",
                   f"hwplug>={release}")


def _template_files(root: Traversable, prefix: tuple[str, ...] = ()
                    ) -> list[tuple[tuple[str, ...], Traversable]]:
    files = []
    for child in sorted(root.iterdir(), key=lambda c: c.name):
        if child.name == "__pycache__":
            continue
        if child.is_dir():
            files += _template_files(child, (*prefix, child.name))
        else:
            files.append(((*prefix, child.name), child))
    return files


def _render_path(parts: tuple[str, ...], names: PluginNames) -> Path:
    renamed = [names.package if part == PACKAGE_PLACEHOLDER else part for part in parts]
    renamed[-1] = renamed[-1].removesuffix(TEMPLATE_SUFFIX)
    return Path(*renamed)


@dataclass(frozen=True)
class GeneratedPlugin:
    """What :func:`create_plugin` wrote: the names used, the package root, the files."""

    names: PluginNames
    root: Path
    files: tuple[Path, ...]


def create_plugin(name: str, target: Path | None = None) -> GeneratedPlugin:
    """Write plugin ``name`` into ``target`` (default ``./hwplug-<name>``).

    Raises :class:`ConfigError` for an invalid name, an existing non-empty ``target``, or a
    file that cannot be written (then nothing written is left behind).
    """
    names = PluginNames.from_name(name)
    target = Path(target) if target is not None else Path.cwd() / names.distribution
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(f"{target} already exists and is not an empty directory; choose "
                          "another --dir")
    existed = target.exists()
    try:
        written = _write_template(names, target)
    except OSError as exc:
        if existed:
            for child in target.iterdir():
                if child.is_dir():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        else:
            shutil.rmtree(target, ignore_errors=True)
        raise ConfigError(f"cannot write the plugin into {exc.filename or target}: "
                          f"{exc.strerror or exc}") from None
    logger.info("wrote plugin %s to %s (%d files)", names.distribution, target, len(written))
    return GeneratedPlugin(names, target, tuple(written))


def _write_template(names: PluginNames, target: Path) -> list[Path]:
    """Render every template file under ``target``; the paths written."""
    values = asdict(names)
    written = []
    for parts, source in _template_files(resources.files(__name__) / "template"):
        path = target / _render_path(parts, names)
        text = source.read_text(encoding="utf-8")
        if source.name.endswith(TEMPLATE_SUFFIX):
            text = string.Template(text).substitute(values)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
