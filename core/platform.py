"""``Platform``: what a device is and what it supports, stated as class attributes.

A vendor subclasses :class:`Platform` in its plugin, sets the facts below and overrides
the queries that need the device (capability, memory, toolkit). hwplug reads the facts to
pick attention backends, kernels, KV-cache dtypes and block sizes, and shows them in
``hwplug info``. Dtypes are named as strings (``"bfloat16"``) so a platform class can be
imported without importing torch; :func:`torch_dtype` converts.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hwplug.errors import UnsupportedError
from hwplug.interface import StrictInterface

if TYPE_CHECKING:
    import torch

    from hwplug.config import EngineConfig
    from hwplug.platforms.sighting import Sighting

logger = logging.getLogger(__name__)

#: Floating dtypes a model can compute in.
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
#: dtype names hwplug understands for compute and KV caches.
DTYPE_NAMES = (*FLOAT_DTYPES, "fp8_e4m3", "fp8_e5m2")
_TORCH_NAMES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a hwplug dtype name (``"fp8_e4m3"`` -> ``torch.float8_e4m3fn``)."""
    import torch

    if name not in DTYPE_NAMES:
        raise UnsupportedError(f"unknown dtype {name!r}; known: {', '.join(DTYPE_NAMES)}")
    return getattr(torch, _TORCH_NAMES.get(name, name))


def dtype_name(dtype: Any) -> str:
    """The hwplug name of a torch dtype or a dtype name string."""
    text = str(dtype).removeprefix("torch.")
    reverse = {v: k for k, v in _TORCH_NAMES.items()}
    text = reverse.get(text, {"float": "float32", "half": "float16", "bf16": "bfloat16",
                              "fp32": "float32", "fp16": "float16"}.get(text, text))
    if text not in DTYPE_NAMES:
        raise UnsupportedError(f"unsupported dtype {dtype!r}; known: {', '.join(DTYPE_NAMES)}")
    return text


@dataclass(frozen=True, order=True)
class DeviceCapability:
    """A device's feature level, e.g. CUDA compute capability 8.9 -> ``(8, 9)``."""

    major: int
    minor: int = 0

    @classmethod
    def parse(cls, value: str | tuple[int, int] | DeviceCapability) -> DeviceCapability:
        if isinstance(value, DeviceCapability):
            return value
        if isinstance(value, tuple):
            return cls(*value)
        major, _, minor = str(value).partition(".")
        return cls(int(major), int(minor or 0))

    def as_int(self) -> int:
        return self.major * 10 + self.minor

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclass(frozen=True)
class MemoryInfo:
    """Device memory in bytes."""

    total: int
    free: int


class Platform(StrictInterface):
    """A kind of device hwplug can run on. Subclass per device kind; set the facts.

    Instances are created by discovery once per process, with the probe's
    :class:`~hwplug.platforms.sighting.Sighting` (None for the built-in CPU platform).
    """

    _interface_root = True

    #: Unique platform name, also the ``HWPLUG_PLATFORM`` value (``"cuda"``).
    name: ClassVar[str] = ""
    #: torch device type tensors live on (``"cuda"``, ``"xpu"``, ``"cpu"``).
    device_type: ClassVar[str] = ""
    #: Who makes the hardware (``"nvidia"``).
    vendor: ClassVar[str] = ""
    #: Accelerators rank above CPUs when several platforms activate.
    is_accelerator: ClassVar[bool] = False
    #: Tie-break among platforms of the same class; higher wins.
    priority: ClassVar[int] = 0
    #: ``torch.distributed`` backend name (``"nccl"``, ``"gloo"``, ``"xccl"``).
    dist_backend: ClassVar[str] = "gloo"
    #: ``"module:Class"`` of a device communicator, or None for plain torch.distributed.
    device_communicator: ClassVar[str | None] = None
    #: Compute dtypes the platform runs models in, best first.
    supported_dtypes: ClassVar[tuple[str, ...]] = ()
    #: KV-cache dtypes it can store (fp8 names only where the hardware supports them).
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ()
    #: Quantization method names it can run.
    supported_quant_methods: ClassVar[tuple[str, ...]] = ("unquantized",)
    #: Attention backends to try, best first.
    attention_backend_priority: ClassVar[tuple[str, ...]] = ()
    #: Block size used when a configuration does not ask for one.
    default_block_size: ClassVar[int] = 16
    #: Environment variables the platform runs best with (e.g. OpenMP settings), set by
    #: :meth:`apply_process_env` where the user has not set them.
    process_env: ClassVar[dict[str, str]] = {}

    def __init__(self, sighting: Sighting | None = None) -> None:
        self.sighting = sighting

    def apply_process_env(self) -> dict[str, str]:
        """Set each :attr:`process_env` variable the environment lacks; return what was set.

        Runtimes read these when torch loads them, so this only acts before torch is
        imported (hwplug's CLI calls it first thing); afterwards it sets nothing.
        """
        if "torch" in sys.modules:
            return {}
        applied = {k: v for k, v in self.process_env.items() if k not in os.environ}
        os.environ.update(applied)
        if applied:
            logger.info("platform %s set %s", self.name,
                        ", ".join(f"{k}={v}" for k, v in applied.items()))
        return applied

    # --- device queries (override where the device knows better) ---------------------

    def is_available(self) -> bool:
        """Whether the device can be used in this process (runtime check, may import torch)."""
        return True

    def device_count(self) -> int:
        return 1

    def get_device_name(self, device_id: int = 0) -> str:
        """Marketing name of the device (``"NVIDIA H100 80GB HBM3"``)."""
        return self.name

    def canonical_device_name(self, device_id: int = 0) -> str:
        """A base model name shared by board variants (``"h100"``), keying tuning tables."""
        return self.name

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        """The device's capability, or None where the notion does not apply."""
        return None

    def has_capability(self, capability: str | tuple[int, int] | DeviceCapability,
                       device_id: int = 0) -> bool:
        """Whether the device's capability is at least ``capability``."""
        current = self.get_device_capability(device_id)
        return current is not None and current >= DeviceCapability.parse(capability)

    def toolkit_version(self) -> str | None:
        """Version of the vendor toolkit torch was built with (CUDA, ROCm, ...), if any."""
        return None

    def memory_info(self, device_id: int = 0) -> MemoryInfo:
        """Total and free device memory."""
        raise UnsupportedError(f"platform {self.name!r} cannot report memory")

    def check_and_update_config(self, config: EngineConfig) -> None:
        """Settle platform-dependent choices in ``config`` before any model is built.

        The default checks the model dtype and KV-cache dtype against the declared facts
        and settles the block size with the attention backend (see
        :func:`hwplug.attention.select_backend`). Raise :class:`UnsupportedError` with the
        reason when the configuration cannot run here.
        """
        from hwplug.attention import settle_attention

        if config.dtype not in self.supported_dtypes:
            raise UnsupportedError(
                f"dtype {config.dtype!r} is not supported on platform {self.name!r}; "
                f"supported: {', '.join(self.supported_dtypes)}"
            )
        kv_dtype = config.kv_cache_dtype or config.dtype
        if kv_dtype not in self.supported_kv_cache_dtypes:
            raise UnsupportedError(
                f"KV-cache dtype {kv_dtype!r} is not supported on platform {self.name!r}; "
                f"supported: {', '.join(self.supported_kv_cache_dtypes)}"
            )
        config.kv_cache_dtype = kv_dtype
        settle_attention(self, config)

    def describe(self) -> dict[str, Any]:
        """The platform's facts as plain data, for ``hwplug info``."""
        capability = self.get_device_capability()
        return {
            "name": self.name,
            "device_type": self.device_type,
            "vendor": self.vendor,
            "device_name": self.get_device_name(),
            "canonical_device_name": self.canonical_device_name(),
            "capability": str(capability) if capability else None,
            "toolkit_version": self.toolkit_version(),
            "dist_backend": self.dist_backend,
            "supported_dtypes": list(self.supported_dtypes),
            "supported_kv_cache_dtypes": list(self.supported_kv_cache_dtypes),
            "supported_quant_methods": list(self.supported_quant_methods),
            "attention_backend_priority": list(self.attention_backend_priority),
        }

    def __repr__(self) -> str:
        return f"<Platform {self.name}>"
