"""Entry point of group ``hwplug.platforms``: a Google TPU, or JAX's CPU standing in for one
(cheap: reads the environment and the OS, imports no torch or jax).

With ``HWPLUG_PLATFORM=tpu`` and ``JAX_PLATFORMS=cpu`` (the documented way to run the
plugin without a TPU) the sighting is JAX's CPU backend standing in: whatever TPU the
host may have, JAX will not use it. Otherwise it is the vendor probe's
(:func:`hwplug.platforms.tpu.probe`): TPU chips by PCI id, or device nodes with
``TPU_ACCELERATOR_TYPE`` set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hwplug.platforms import tpu
from hwplug.platforms.sighting import Sighting, activator

#: The device name of the stand-in sighting.
STAND_IN = "JAX CPU"
#: ``details["jax_backend"]`` of a stand-in sighting.
JAX_BACKEND_DETAIL = "jax_backend"


def stand_in(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` asks for the tpu platform on JAX's CPU backend only."""
    platforms = [p.strip().lower() for p in environ.get("JAX_PLATFORMS", "").split(",")]
    return environ.get("HWPLUG_PLATFORM", "").strip() == "tpu" and platforms == ["cpu"]


def probe(root: Path = Path("/"), *, environ: Mapping[str, str] | None = None
          ) -> Sighting | None:
    """The stand-in sighting when :func:`stand_in` holds, else the TPU chips under ``root``."""
    environ = os.environ if environ is None else environ
    if stand_in(environ):
        return tpu.KIND.sighting([STAND_IN], "JAX_PLATFORMS=cpu with HWPLUG_PLATFORM=tpu",
                                 details={JAX_BACKEND_DETAIL: "cpu"})
    return tpu.probe(root, environ=environ)


activate = activator("hwplug_tpu.platform:TpuPlatform", probe)
