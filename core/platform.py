"""Deprecated: release 0.1's ``hwplug.platform``, kept so that packages written against it
still import. Its names now live in :mod:`hwplug.platform_interface` (``Platform``),
:mod:`hwplug.device` (``DeviceCapability``, ``MemoryInfo``) and :mod:`hwplug.dtypes`.
Importing this module warns once; it goes in the release after next (see docs/api.md).
"""

import warnings

from hwplug.device import DeviceCapability, MemoryInfo
from hwplug.dtypes import DTYPE_NAMES, FLOAT_DTYPES, dtype_name, torch_dtype
from hwplug.platform_interface import Platform

warnings.warn("hwplug.platform is deprecated: import Platform from hwplug (or "
              "hwplug.platform_interface), DeviceCapability and MemoryInfo from hwplug.device, "
              "the dtype helpers from hwplug.dtypes", DeprecationWarning, stacklevel=2)

__all__ = ["DTYPE_NAMES", "FLOAT_DTYPES", "DeviceCapability", "MemoryInfo", "Platform",
           "dtype_name", "torch_dtype"]
