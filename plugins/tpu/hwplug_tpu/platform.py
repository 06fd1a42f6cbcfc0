"""``TpuPlatform``: Google TPUs, programmed through JAX rather than torch.

The zoo's model code runs as torch on the host; every op it calls through the kernel
registry runs as a jitted JAX function on the JAX device (:mod:`hwplug_tpu.bridge`). So
torch tensors live on ``cpu`` (the platform's ``device_type``) and the compute happens
where JAX runs: a TPU, or JAX's CPU backend standing in for one (``JAX_PLATFORMS=cpu``
with ``HWPLUG_PLATFORM=tpu``). An engine's weights and KV caches are placed on that device
once (:meth:`TpuPlatform.place_state`, :mod:`hwplug_tpu.bridge`), and its decode steps
run as one compiled JAX function per batch bucket (:meth:`TpuPlatform.step_recorder`,
:mod:`hwplug_tpu.step`) that also samples the next tokens
(:meth:`TpuPlatform.device_sampler`): only the step's inputs and its token ids cross.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

from hwplug.platform_interface import DeviceCapability, DeviceFacts, MemoryInfo, Platform
from hwplug.platforms import tpu
from hwplug_tpu.probe import JAX_BACKEND_DETAIL

if TYPE_CHECKING:
    import torch

    from hwplug_tpu.sampler import JaxSampler
    from hwplug_tpu.step import JaxStepRecorder

#: Device features the facts carry: which JAX backend the ops run on.
JAX_TPU, JAX_CPU = "jax-tpu", "jax-cpu"
_GIB = 1 << 30


class TpuPlatform(Platform):
    """TPU chips as JAX devices, or JAX's CPU backend standing in for them.

    Facts from the sighting: the chip generation (v4, v5e, v5p, v6e, ...) gives the
    device capability (``5.1`` for a v5p) and the HBM per chip; the chip count is the
    sighting's. On the stand-in there is no capability, float32 ranks first (XLA's CPU
    backend emulates bfloat16 arithmetic) and the feature ``jax-cpu`` keeps TPU-only
    kernels away; on a TPU that JAX drives the feature is ``jax-tpu``.
    """

    name: ClassVar[str] = "tpu"
    #: torch tensors stay on the host; the ops hand them to JAX (see the module doc).
    device_type: ClassVar[str] = "cpu"
    vendor: ClassVar[str] = "google"
    is_accelerator: ClassVar[bool] = True
    dist_backend: ClassVar[str] = "xla"
    supported_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float32")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float32")
    attention_backend_priority: ClassVar[tuple[str, ...]] = ("PALLAS_RPA",)
    #: Its JAX ops cover float weights only: a GGUF loads dequantized, other quantized
    #: checkpoints are refused (their GEMMs would run the torch references on the host).
    supported_quant_methods: ClassVar[tuple[str, ...]] = ("unquantized",)

    @property
    def _stands_in(self) -> bool:
        """Whether JAX's CPU backend stands in for a TPU (the probe's stand-in sighting)."""
        return self._sighting_detail(JAX_BACKEND_DETAIL) == "cpu"

    def derive_facts(self, facts: DeviceFacts) -> DeviceFacts:
        if self._stands_in:
            return facts.narrowed(
                "JAX's CPU backend stands in for a TPU: no TPU kernels, float32 first (XLA's "
                "CPU backend emulates bfloat16)", features=facts.features | {JAX_CPU},
                supported_dtypes=("float32", "bfloat16"))
        if facts.available:
            return facts.narrowed("JAX drives the TPU", features=facts.features | {JAX_TPU})
        return facts

    def is_available(self) -> bool:
        return self._stands_in or bool(_tpus())

    def get_device_name(self, device_id: int = 0) -> str:
        tpus = [] if self._stands_in else _tpus()
        return tpus[device_id].device_kind if tpus else super().get_device_name(device_id)

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        generation = self._generation()
        return DeviceCapability(*generation.level) if generation else None

    def toolkit_version(self) -> str | None:
        import jax

        return jax.__version__

    def memory_info(self, device_id: int = 0) -> MemoryInfo:
        """The host's memory on the stand-in (available memory, as the cpu platform counts
        it); else the chip's HBM as JAX reports it, or the generation's HBM per chip (all
        free) when it reports nothing."""
        if self._stands_in:
            from hwplug.platforms.cpu.platform import host_memory

            return host_memory()
        tpus = _tpus()
        stats = tpus[device_id].memory_stats() if tpus else None
        if stats and "bytes_limit" in stats:
            total = stats["bytes_limit"]
            return MemoryInfo(total=total, free=total - stats.get("bytes_in_use", 0))
        generation = self._generation()
        if generation is None:
            return super().memory_info(device_id)
        return MemoryInfo(total=generation.hbm_gib * _GIB, free=generation.hbm_gib * _GIB)

    def place_state(self, weights: Iterable[torch.Tensor], kv_caches: Iterable[torch.Tensor]
                    ) -> None:
        """Copy the engine's weights and KV caches to the JAX device the ops compute on, once:
        the ops read them there from now on, and the cache ops write the device copies."""
        from hwplug_tpu.bridge import device, place

        target = device()
        for weight in weights:
            place(weight, target)
        for cache in kv_caches:
            place(cache, target, mutable=True)

    def step_recorder(self) -> JaxStepRecorder:
        """Steps recorded as the JAX ops of this plugin's variants and compiled whole, one
        XLA program per decode batch bucket (see :mod:`hwplug_tpu.step`)."""
        from hwplug_tpu.step import RECORDER

        return RECORDER

    def device_sampler(self) -> JaxSampler:
        """Tokens sampled on the JAX device, a replayed decode step's inside its compiled
        program: only token ids come back (see :mod:`hwplug_tpu.sampler`)."""
        from hwplug_tpu.sampler import SAMPLER

        return SAMPLER

    def execution_summary(self) -> str | None:
        """The XLA compilations so far and how many of them were whole steps."""
        from hwplug_tpu.compilations import compilations
        from hwplug_tpu.step import RECORDER

        return f"{compilations().describe()}; {RECORDER.describe()}"

    def _generation(self) -> tpu.Generation | None:
        if self.sighting is None or self._stands_in:
            return None
        return tpu.generation(self.sighting)


def _tpus() -> list:
    """The TPUs JAX drives in this process (none without JAX's TPU runtime)."""
    import jax

    try:
        return jax.devices("tpu")
    except RuntimeError:  # no TPU backend
        return []
