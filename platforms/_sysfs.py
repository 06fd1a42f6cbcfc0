"""Tolerant readers for the /proc, /sys and /dev entries the hardware probes look at.

Every path is taken relative to a ``root`` directory, so tests can hand the probes a
fake tree. Nothing here raises on a missing, unreadable or garbled file: the reader
returns None (or skips the entry) and logs at debug level.
"""

from __future__ import annotations

import logging
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)


def read_text(path: Path) -> str | None:
    """The file's text (undecodable bytes replaced), or None when it cannot be read."""
    try:
        return path.read_text(errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        logger.debug("cannot read %s: %s", path, exc)
        return None


def read_hex(path: Path) -> int | None:
    """A sysfs hex value such as ``0x10de``, or None when missing or not hex."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip(), 16)
    except ValueError:
        logger.debug("%s holds no hex number: %.40r", path, text)
        return None


def machine(root: Path) -> str:
    """The host's architecture (``x86_64``, ``aarch64``): ``/proc/sys/kernel/arch`` under
    ``root``, else :func:`platform.machine` (kernels before 4.16 lack the file)."""
    text = (read_text(root / "proc/sys/kernel/arch") or "").strip()
    return text or platform.machine()


def parse_fields(text: str, sep: str | None = ":") -> dict[str, str]:
    """``key<sep>value`` lines as a dict (stripped; the first occurrence of a key wins).

    ``sep=None`` splits at the first run of whitespace (KFD ``properties`` files).
    Lines without a separator are skipped.
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(sep, 1)
        if len(parts) == 2 and parts[0].strip():
            fields.setdefault(parts[0].strip(), parts[1].strip())
    return fields


def cpuinfo_blocks(root: Path) -> list[dict[str, str]]:
    """The ``processor`` blocks of ``/proc/cpuinfo`` under ``root`` as field dicts (one
    per logical CPU); empty when the file is missing (macOS) or holds none."""
    text = read_text(root / "proc/cpuinfo") or ""
    return [fields for block in text.split("\n\n")
            if "processor" in (fields := parse_fields(block))]


def shared_words(blocks: list[dict[str, str]], key: str) -> set[str]:
    """The words of field ``key`` (``flags``, ``Features``) that every block has."""
    return set.intersection(*(set(b.get(key, "").split()) for b in blocks)) if blocks else set()


def numbered(directory: Path, prefix: str = "") -> list[Path]:
    """Entries of ``directory`` named ``prefix`` + digits (``nvidia0``), in numeric order."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)")
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    matches = [(int(m.group(1)), name) for name in names if (m := pattern.fullmatch(name))]
    return [directory / name for _, name in sorted(matches)]


@dataclass(frozen=True)
class PciFunction:
    """One PCI function as sysfs shows it.

    ``path`` is the sysfs directory that holds ``vendor``/``device``/``class`` (as
    reached, e.g. ``/sys/class/drm/card0/device``); ``address`` is its bus address
    (``0000:01:00.0``); ``driver`` the bound driver's name, None when unbound.
    """

    path: Path
    address: str
    vendor: int
    device: int | None
    class_code: int | None
    driver: str | None

    @property
    def pci_id(self) -> str:
        """``vendor:device`` in lower-case hex (``10de:2330``)."""
        device = "????" if self.device is None else f"{self.device:04x}"
        return f"{self.vendor:04x}:{device}"

    @property
    def vendor_file(self) -> Path:
        return self.path / "vendor"


def _pci_function(path: Path, vendor: int) -> PciFunction | None:
    if read_hex(path / "vendor") != vendor:
        return None
    try:
        driver: str | None = os.path.basename(os.readlink(path / "driver"))
    except OSError:
        driver = None
    return PciFunction(path, os.path.basename(os.path.realpath(path)), vendor,
                       read_hex(path / "device"), read_hex(path / "class"), driver)


def pci_functions(root: Path, vendor: int) -> list[PciFunction]:
    """The functions under ``/sys/bus/pci/devices/*`` whose ``vendor`` file is ``vendor``."""
    try:
        entries = sorted((root / "sys/bus/pci/devices").iterdir())
    except OSError:
        return []
    return [f for entry in entries if (f := _pci_function(entry, vendor))]


def drm_cards(root: Path, vendor: int) -> list[PciFunction]:
    """The PCI functions behind ``/sys/class/drm/card<N>/device`` whose vendor is ``vendor``."""
    cards = numbered(root / "sys/class/drm", "card")
    return [f for card in cards if (f := _pci_function(card / "device", vendor))]
