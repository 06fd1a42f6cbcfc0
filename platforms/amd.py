"""Probe for AMD Instinct / Radeon GPUs (served by the ``rocm`` platform of hwplug-rocm-aiter).

Reads, under ``root``:

1. when ``/dev/kfd`` (the ROCm compute driver) exists,
   ``/sys/class/kfd/kfd/topology/nodes/<N>/properties``: a node with ``simd_count`` > 0 is
   a GPU; its ``gfx_target_version`` (``90402``) gives the ISA (``gfx942``) and its
   ``drm_render_minor`` leads to ``/sys/class/drm/renderD<minor>/device/product_name``;
2. otherwise ``/sys/class/drm/card<N>/device/vendor`` == ``0x1002`` (named by
   ``product_name`` where the board exposes one, else by PCI id).

``details["gfx_targets"]`` lists the ISAs seen, comma-separated, when known
(:func:`gfx_capability` turns one into the capability torch's ROCm build reports); the
first GPU's amdgpu ``mem_info_vram_total`` / ``mem_info_vram_used`` (bytes) give
``details["vram_total"]`` / ``details["vram_used"]`` where the driver exposes them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hwplug.platforms._sysfs import drm_cards, numbered, parse_fields, read_text
from hwplug.platforms.sighting import DeviceKind, Sighting

KIND = DeviceKind(name="rocm", vendor="amd", plugin_extra="rocm-aiter")
PCI_VENDOR = 0x1002


def probe(root: Path = Path("/"), *, environ: Mapping[str, str] | None = None) -> Sighting | None:
    """A sighting of the AMD GPUs visible under ``root``, or None. Never raises on bad files.

    ``environ`` is accepted for the common probe signature and not consulted.
    """
    nodes = _kfd_gpu_nodes(root) if os.path.exists(root / "dev/kfd") else []
    if nodes:
        targets = sorted({t for _, fields in nodes if (t := _gfx_target(fields))})
        details = {"gfx_targets": ",".join(targets)} if targets else {}
        details.update(_vram(_render_device(root, nodes[0][1])))
        return KIND.sighting([_node_name(root, fields) for _, fields in nodes], nodes[0][0],
                             details=details)
    cards = drm_cards(root, PCI_VENDOR)
    if cards:
        names = [_product_name(card.path.parent) or card.pci_id for card in cards]
        return KIND.sighting(names, cards[0].vendor_file, details=_vram(cards[0].path))
    return None


def gfx_name(gfx_target_version: int) -> str:
    """The ISA name of a KFD ``gfx_target_version`` (``90402`` -> ``"gfx942"``).

    The value packs major * 10000 + minor * 100 + stepping; minor and stepping are
    written in hex (``90010`` -> ``"gfx90a"``).
    """
    major, rest = divmod(gfx_target_version, 10000)
    minor, stepping = divmod(rest, 100)
    return f"gfx{major}{minor:x}{stepping:x}"


def gfx_capability(target: str) -> str | None:
    """The device capability torch's ROCm build reports for an ISA: its major version and
    minor digit (``gfx942`` -> ``"9.4"``, ``gfx90a`` -> ``"9.0"``, ``gfx950`` -> ``"9.5"``,
    ``gfx1100`` -> ``"11.0"``); None for a name that is not ``gfx<major><minor><stepping>``."""
    digits = target.removeprefix("gfx")
    if len(digits) < 3 or not digits[:-2].isdecimal():
        return None
    try:
        return f"{int(digits[:-2])}.{int(digits[-2], 16)}"
    except ValueError:
        return None


def _kfd_gpu_nodes(root: Path) -> list[tuple[Path, dict[str, str]]]:
    """(properties file, its fields) of each KFD topology node with SIMDs, i.e. each GPU."""
    nodes = []
    for node in numbered(root / "sys/class/kfd/kfd/topology/nodes"):
        fields = parse_fields(read_text(node / "properties") or "", sep=None)
        if _int_field(fields, "simd_count") > 0:
            nodes.append((node / "properties", fields))
    return nodes


def _gfx_target(fields: Mapping[str, str]) -> str | None:
    version = _int_field(fields, "gfx_target_version")
    return gfx_name(version) if version else None


def _render_device(root: Path, fields: Mapping[str, str]) -> Path | None:
    """The PCI device directory behind a KFD node's render node, if it names one."""
    minor = fields.get("drm_render_minor", "")
    return root / f"sys/class/drm/renderD{minor}/device" if minor.isdecimal() else None


def _node_name(root: Path, fields: Mapping[str, str]) -> str:
    device = _render_device(root, fields)
    product = _product_name(device.parent) if device is not None else None
    return product or _gfx_target(fields) or "AMD GPU"


def _vram(device: Path | None) -> dict[str, str]:
    """amdgpu's VRAM total and use in bytes for a PCI device directory, where it has them."""
    found = {}
    for key, name in (("vram_total", "mem_info_vram_total"), ("vram_used", "mem_info_vram_used")):
        text = (read_text(device / name) or "").strip() if device is not None else ""
        if text.isdecimal():
            found[key] = text
    return found


def _int_field(fields: Mapping[str, str], key: str) -> int:
    value = fields.get(key, "")
    return int(value) if value.isdecimal() else 0


def _product_name(drm_entry: Path) -> str | None:
    """``product_name`` of the board behind a ``/sys/class/drm`` entry, if it has one."""
    return (read_text(drm_entry / "device/product_name") or "").strip() or None
