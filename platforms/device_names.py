"""Canonical device names: the base model a marketing string names, for tuning tables.

``"NVIDIA H100 80GB HBM3"`` and ``"NVIDIA H100 PCIe"`` are both ``"h100"``, so a tuned
config is shared across board variants; Arm cores keep their series
(``"Neoverse V2"`` -> ``"neoverse-v2"``). Unknown strings reduce to a lower-case slug.
"""

from __future__ import annotations

import re

_VENDOR_WORDS = re.compile(
    r"\b(nvidia|amd|intel\(r\)|intel|tesla|geforce|quadro|radeon|instinct|data center gpu|"
    r"graphics|google|tpu)\b", re.IGNORECASE)
#: An Arm core: its series and model (Neoverse V2, Cortex-A72).
_ARM_CORE = re.compile(r"\b(neoverse|cortex)[\s-]*([a-z]?\d+[a-z]*)\b", re.IGNORECASE)
#: A model token: letters then digits, optional suffix letters (h100, mi300x, rtx4090, l40s).
_MODEL = re.compile(r"\b((?:rtx|gtx)\s?\d{3,4}\w*|[a-z]{1,3}\d{2,4}[a-z]?|max\s?\d{3,4}|"
                    r"v\d+[a-z]*)\b", re.IGNORECASE)


def canonical_device_name(name: str) -> str:
    """Reduce a device's marketing name to its base model (``"h100"``, ``"mi300x"``)."""
    core = _ARM_CORE.search(name)
    if core:
        return f"{core.group(1)}-{core.group(2)}".lower()
    stripped = _VENDOR_WORDS.sub(" ", name)
    match = _MODEL.search(stripped)
    if match:
        return re.sub(r"\s+", "", match.group(1)).lower()
    slug = re.sub(r"[^a-z0-9]+", "-", stripped.lower()).strip("-")
    return slug or "unknown"
