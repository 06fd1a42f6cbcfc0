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
from hwplug.platform_interface import Platform
from hwplug.quantization import QuantMethod


def quant_method_for(quant_config: dict[str, Any] | None, platform: Platform,
                     dtype: str) -> QuantMethod:
    """The quant method of a checkpoint with ``quant_config`` on ``platform``, computing in
    ``dtype``.

    The method must be registered (a removed one raises
    :class:`~hwplug.errors.RemovedError` naming its replacement), run on the platform
    (:meth:`~hwplug.Platform.quant_method_reasons`: its requirements, and the platform's
    list where it has one) and compute in ``dtype``; otherwise an
    :class:`UnsupportedError` says why.
    """
    name = method_name(quant_config)
    cls = registries.quant_methods.get(name)  # unknown -> lists; removed -> replacement
    reasons = platform.quant_method_reasons(name)
    if reasons:
        raise UnsupportedError(f"quantization {name!r} cannot run on platform "
                               f"{platform.name!r} ({platform.facts.device_name}): "
                               f"{'; '.join(reasons)}; methods it runs: "
                               f"{', '.join(platform.quant_methods()) or 'none'}")
    if dtype not in cls.supported_dtypes:
        raise UnsupportedError(f"quantization {name!r} computes in "
                               f"{', '.join(cls.supported_dtypes)}, not {dtype}")
    return cls.from_config(quant_config)
