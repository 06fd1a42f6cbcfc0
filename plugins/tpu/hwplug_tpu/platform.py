"""``TpuPlatform``: Google TPUs, programmed through JAX rather than torch."""

from __future__ import annotations

from typing import ClassVar

from hwplug.platform_interface import Platform


class TpuPlatform(Platform):
    """TPU chips as JAX devices. Kernels of this plugin are JAX functions.

    No attention backend is registered yet, so building a model here raises an error
    that says so instead of silently using another device.
    """

    name: ClassVar[str] = "tpu"
    device_type: ClassVar[str] = "tpu"
    vendor: ClassVar[str] = "google"
    is_accelerator: ClassVar[bool] = True
    dist_backend: ClassVar[str] = "xla"
    supported_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float32")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float32")
    attention_backend_priority: ClassVar[tuple[str, ...]] = ()

    def is_available(self) -> bool:
        return bool(_tpus())

    def get_device_name(self, device_id: int = 0) -> str:
        tpus = _tpus()
        return tpus[device_id].device_kind if tpus else super().get_device_name(device_id)

    def toolkit_version(self) -> str | None:
        import jax

        return jax.__version__


def _tpus() -> list:
    import jax

    return [d for d in jax.devices() if d.platform == "tpu"]
