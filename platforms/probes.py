"""Every hardware probe hwplug knows, keyed by device kind, and a runner that isolates them.

A probe is a cheap function (standard library only: no torch, triton, jax or numpy)
``probe(root=Path("/"), *, environ=None) -> Sighting | None`` that reads the OS under
``root`` and, where a probe needs them, the environment variables in ``environ``
(None: ``os.environ``). It returns None when it sees no hardware of its kind.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from hwplug.platforms import amd, arm, intel_xpu, nvidia, tpu
from hwplug.platforms.sighting import Sighting

logger = logging.getLogger(__name__)


class Probe(Protocol):
    """The signature every probe shares (see the module docstring)."""

    def __call__(self, root: Path = ..., *,
                 environ: Mapping[str, str] | None = None) -> Sighting | None: ...


_MODULES = (nvidia, amd, intel_xpu, tpu, arm)

#: device kind (platform name, e.g. ``"cuda"``) -> its probe.
ALL_PROBES: Mapping[str, Probe] = MappingProxyType({m.KIND.name: m.probe for m in _MODULES})
#: device kind -> the ``hwplug`` extra that installs its plugin (``"rocm"`` -> ``"rocm-aiter"``).
KNOWN_PLUGINS: Mapping[str, str] = MappingProxyType(
    {m.KIND.name: m.KIND.plugin_extra for m in _MODULES})


def probe_all(root: Path = Path("/"), environ: Mapping[str, str] | None = None,
              probes: Mapping[str, Probe] = ALL_PROBES) -> list[Sighting]:
    """Run every probe in ``probes`` (default: all known) and return what they saw, in order.

    A probe that raises is logged at debug level and counts as having seen nothing, so
    one broken probe never hides the others.
    """
    sightings = []
    for kind, probe in probes.items():
        try:
            sighting = probe(root, environ=environ)
        except Exception:
            logger.debug("probe %r raised; treated as seeing nothing", kind, exc_info=True)
            continue
        if sighting is not None:
            logger.debug("probe %r saw %s (evidence: %s)", kind, sighting.devices,
                         sighting.evidence)
            sightings.append(sighting)
    return sightings
