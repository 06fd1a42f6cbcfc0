"""The quant methods hwplug ships (implementations of :class:`hwplug.QuantMethod`), and the
choice of one for a checkpoint on a platform.

``unquantized`` (:mod:`.unquantized`), ``fp8`` and ``int8`` (:mod:`.scaled`), ``int4``
(:mod:`.int4`), registered by :mod:`hwplug.model_zoo.plugin`; a checkpoint's
``quantization_config`` names one through :func:`.formats.method_name`.
"""

from __future__ import annotations

from typing import Any

from hwplug import registries
from hwplug.errors import UnsupportedError
from hwplug.model_zoo.quant_methods.formats import method_name
from hwplug.platform_interface import DeviceCapability, Platform
from hwplug.quantization import QuantMethod


def quant_method_for(quant_config: dict[str, Any] | None, platform: Platform,
                     dtype: str) -> QuantMethod:
    """The quant method of a checkpoint with ``quant_config`` on ``platform``, computing in
    ``dtype``.

    Gates, each a typed error naming what is supported: the method must be registered (a
    removed one raises :class:`~hwplug.errors.RemovedError` naming its replacement), among
    the platform's ``facts.supported_quant_methods``, at or above its ``min_capability``
    where the device reports a capability, and able to compute in ``dtype``.
    """
    name = method_name(quant_config)
    cls = registries.quant_methods.get(name)  # unknown -> lists; removed -> replacement
    facts = platform.facts
    if name not in facts.supported_quant_methods:
        raise UnsupportedError(f"quantization {name!r} is not supported on platform "
                               f"{platform.name!r}; supported: "
                               f"{', '.join(facts.supported_quant_methods)}")
    needed = cls.min_capability
    if needed and facts.capability is not None and facts.capability < DeviceCapability.parse(
            needed):
        raise UnsupportedError(f"quantization {name!r} needs device capability {needed}; "
                               f"{facts.device_name} has {facts.capability}")
    if dtype not in cls.supported_dtypes:
        raise UnsupportedError(f"quantization {name!r} computes in "
                               f"{', '.join(cls.supported_dtypes)}, not {dtype}")
    return cls.from_config(quant_config)
