"""``Platform``: what a kind of device is (class attributes) and what this one can do (facts).

A vendor subclasses :class:`Platform` in its plugin and states the facts of the device
*kind* as class attributes: its name, device type, families, the dtypes, KV-cache dtypes,
quant methods and attention backends the kind can run (best first). Discovery creates one
instance per process with the :class:`~hwplug.platforms.sighting.Sighting` its probe
returned; the instance's :attr:`Platform.facts` narrow the class's lists to the device
actually present (fp8 KV caches only from a capability, bf16 only where the cores have
it). Facts are computed once, by :meth:`Platform.derive_facts`, and read by ranking,
:meth:`Platform.check_and_update_config`, ``hwplug info`` and the conformance kit alike.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from hwplug import registries
from hwplug.device import DeviceCapability, DeviceFacts, MemoryInfo
from hwplug.dtypes import AUTO, auto_dtype
from hwplug.errors import UnsupportedError
from hwplug.interface import StrictInterface
from hwplug.platforms.device_names import canonical_device_name

if TYPE_CHECKING:
    import torch

    from hwplug.config import EngineConfig
    from hwplug.platforms.sighting import Sighting
    from hwplug.step_replay import DeviceSampler, StepRecorder

__all__ = ["DeviceCapability", "DeviceFacts", "MemoryInfo", "Platform"]

logger = logging.getLogger(__name__)


class Platform(StrictInterface):
    """A kind of device hwplug can run on. Subclass per device kind; set the facts.

    Instances are created by discovery once per process, with the probe's
    :class:`~hwplug.platforms.sighting.Sighting` (None when the hardware was not seen,
    e.g. a platform class checked on a machine without it).
    """

    _interface_root = True

    #: Unique platform name, also the ``HWPLUG_PLATFORM`` value (``"cuda"``).
    name: ClassVar[str] = ""
    #: torch device type tensors live on (``"cuda"``, ``"xpu"``, ``"cpu"``).
    device_type: ClassVar[str] = ""
    #: Who makes the hardware (``"nvidia"``).
    vendor: ClassVar[str] = ""
    #: Other platform or family names whose kernels and backends this platform runs
    #: (hwplug-cpu-arm's ``cpu-arm`` is a ``cpu``); see :meth:`matches`.
    families: ClassVar[tuple[str, ...]] = ()
    #: Accelerators rank above CPUs when several platforms activate.
    is_accelerator: ClassVar[bool] = False
    #: Tie-break among platforms of the same class; higher wins.
    priority: ClassVar[int] = 0
    #: ``torch.distributed`` backend name (``"nccl"``, ``"gloo"``, ``"xccl"``).
    dist_backend: ClassVar[str] = "gloo"
    #: ``"module:Class"`` of a device communicator, or None for plain torch.distributed.
    device_communicator: ClassVar[str | None] = None
    #: Compute dtypes the platform kind runs models in, best first (``auto`` takes the
    #: first the checkpoint allows).
    supported_dtypes: ClassVar[tuple[str, ...]] = ()
    #: KV-cache dtypes the kind can store (fp8 names only where the hardware can).
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ()
    #: Quantization methods it may run: None (the default) lets every registered method
    #: whose requirements the device meets run (see :meth:`quant_methods`); a tuple
    #: restricts them to those names (a veto by omission, e.g. no fp8 on one GPU family).
    supported_quant_methods: ClassVar[tuple[str, ...] | None] = None
    #: Attention backends to try first, best first; registered backends declared for this
    #: platform follow them (see :meth:`attention_backends`).
    attention_backend_priority: ClassVar[tuple[str, ...]] = ()
    #: Block size used when a configuration does not ask for one.
    default_block_size: ClassVar[int] = 16
    #: Environment variables the platform runs best with (e.g. OpenMP settings), set by
    #: :meth:`apply_process_env` where the user has not set them.
    process_env: ClassVar[dict[str, str]] = {}

    def __init__(self, sighting: Sighting | None = None) -> None:
        self.sighting = sighting

    # --- facts of this device ----------------------------------------------------------

    @functools.cached_property
    def facts(self) -> DeviceFacts:
        """This instance's :class:`DeviceFacts`, computed on first use by
        :meth:`derive_facts` from the class's lists and the device queries."""
        facts = self.derive_facts(DeviceFacts(
            device_name=self.get_device_name(),
            canonical_name=canonical_device_name(self.get_device_name()),
            device_count=self.device_count(),
            capability=self.get_device_capability(),
            features=frozenset(self._sighting_detail("features").split()),
            supported_dtypes=self.supported_dtypes,
            supported_kv_cache_dtypes=self.supported_kv_cache_dtypes,
            supported_quant_methods=self.supported_quant_methods,
            attention_backend_priority=self.attention_backend_priority,
            available=self.is_available()))
        for note in facts.notes:
            logger.info("platform %s: %s", self.name, note)
        return facts

    def derive_facts(self, facts: DeviceFacts) -> DeviceFacts:
        """Narrow the class's ``facts`` to this device (called once, by :attr:`facts`).

        Override to drop what the device lacks, with a reason, e.g.
        ``facts.without_dtypes(["bfloat16"], "the cores lack bf16")``; read
        ``self.sighting`` and ``facts.capability`` / ``facts.features``. The default
        keeps everything.
        """
        return facts

    def _sighting_detail(self, key: str, default: str = "") -> str:
        details = self.sighting.details if self.sighting is not None else {}
        return details.get(key, default)

    def matches(self, names: Iterable[str]) -> bool:
        """Whether something declared for the platforms ``names`` serves this platform:
        ``names`` is empty (any platform), or holds its name or one of its families."""
        wanted = set(names)
        return not wanted or bool(wanted & {self.name, *self.families})

    # --- what is registered for this device ------------------------------------------

    def quant_methods(self) -> tuple[str, ...]:
        """The registered quant methods this device runs, in registration order: each whose
        :meth:`~hwplug.QuantMethod.requirements` it meets (a capability bound applies only
        where the device reports a capability: a CPU emulates), within
        ``facts.supported_quant_methods`` when that is a tuple."""
        return tuple(name for name in registries.quant_methods.names()
                     if not self.quant_method_reasons(name))

    def quant_method_reasons(self, name: str) -> list[str]:
        """Why the registered quant method ``name`` cannot run here (empty: it can)."""
        allowed = self.facts.supported_quant_methods
        if allowed is not None and name not in allowed:
            return [f"the platform allows only {', '.join(allowed) or 'none'}"]
        try:
            requirements = registries.quant_methods.get(name).requirements()
        except Exception as exc:  # a method that fails to import runs nowhere
            return [f"failed to import: {exc!r}"]
        if self.facts.capability is None:
            requirements = dataclasses.replace(requirements, min_capability=None,
                                               max_capability=None)
        return requirements.reasons(self)

    def attention_backends(self) -> tuple[str, ...]:
        """Attention backends to try, best first: ``facts.attention_backend_priority``, then
        every other registered backend declared for this platform or a family of it
        (``platforms`` not empty), in registration order, then the MLA backends declared
        for any platform (``is_mla``, ``platforms`` empty: ``TORCH_MLA``), so a latent
        attention model runs on a platform that lists none of its own (a platform that
        lists no backend at all still declares none). They serve only MLA specs, so no
        other model ever reaches them."""
        listed = [registries.attention_backends.current_name(name)
                  for name in self.facts.attention_backend_priority]
        portable_mla = []
        for name in registries.attention_backends.names():
            if name in listed:
                continue
            try:
                backend = registries.attention_backends.get(name)
            except Exception:  # reported by selection, which imports every backend too
                continue
            if backend.platforms and self.matches(backend.platforms):
                listed.append(name)
            elif not backend.platforms and backend.is_mla:
                portable_mla.append(name)
        return (*listed, *portable_mla) if listed else ()

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
        """How many devices of this kind the process sees (the sighting's count by default)."""
        return self.sighting.count if self.sighting is not None else 1

    def get_device_name(self, device_id: int = 0) -> str:
        """Marketing name of the device (``"NVIDIA H100 80GB HBM3"``)."""
        if self.sighting is not None and self.sighting.devices:
            return self.sighting.devices[min(device_id, len(self.sighting.devices) - 1)]
        return self.name

    def canonical_device_name(self, device_id: int = 0) -> str:
        """A base model name shared by board variants (``"h100"``), keying tuning tables."""
        return canonical_device_name(self.get_device_name(device_id))

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

        The default resolves dtype ``auto`` (the first of ``facts.supported_dtypes`` the
        checkpoint allows), checks the dtype and KV-cache dtype against :attr:`facts` and
        settles the attention backend and block size (see
        :func:`hwplug.attention_selection.settle_attention`). Raise
        :class:`UnsupportedError` with the reason when the configuration cannot run here.
        """
        from hwplug.attention_selection import settle_attention

        facts = self.facts
        if config.dtype == AUTO:
            config.dtype = auto_dtype(facts.supported_dtypes, config.checkpoint_dtype)
        if config.dtype not in facts.supported_dtypes:
            raise UnsupportedError(
                f"dtype {config.dtype!r} is not supported on platform {self.name!r}; "
                f"supported: {', '.join(facts.supported_dtypes)}")
        kv_dtype = config.kv_cache_dtype or config.dtype
        if kv_dtype not in facts.supported_kv_cache_dtypes:
            raise UnsupportedError(
                f"KV-cache dtype {kv_dtype!r} is not supported on platform {self.name!r}; "
                f"supported: {', '.join(facts.supported_kv_cache_dtypes)}")
        config.kv_cache_dtype = kv_dtype
        settle_attention(self, config)

    def step_recorder(self) -> StepRecorder | None:
        """How this platform replays a recorded step (see :mod:`hwplug.step_replay`), or
        None, the default: every step runs eagerly and nothing is recorded. The CPU
        platform records the native kernel calls of its C kernels."""
        return None

    def device_sampler(self) -> DeviceSampler | None:
        """How this platform samples tokens where its logits are computed (see
        :mod:`hwplug.step_replay`), or None, the default: the engine samples in torch.
        A platform that returns one records steps that can end in it
        (:class:`~hwplug.step_replay.SamplingStep`)."""
        return None

    def place_state(self, weights: Iterable[torch.Tensor], kv_caches: Iterable[torch.Tensor]
                    ) -> None:
        """Called once by an engine's model runner, before its first step, with its model's
        parameters and buffers and its KV caches (none when a KV connector reads them in
        torch). A platform that computes where torch's tensors do not live (the tpu
        platform: on JAX's device) keeps them there for the engine's lifetime, so no weight
        or cache crosses per step; its cache ops then write the device copy, not the KV
        caches' torch tensors. The default does nothing."""

    def execution_summary(self) -> str | None:
        """One line on how this process has run models so far, which ``hwplug generate``
        prints after its speed line: e.g. how many JIT compilations a compiling platform
        made (a count that keeps growing shows a shape that recompiles every step). The
        default, None, prints nothing."""
        return None

    def describe(self) -> dict[str, Any]:
        """The platform's facts as plain data, for ``hwplug info``."""
        facts = self.facts
        return {
            "name": self.name,
            "device_type": self.device_type,
            "vendor": self.vendor,
            "families": list(self.families),
            "device_name": facts.device_name,
            "canonical_device_name": facts.canonical_name,
            "device_count": facts.device_count,
            "capability": str(facts.capability) if facts.capability else None,
            "features": sorted(facts.features),
            "available": facts.available,
            "toolkit_version": self.toolkit_version(),
            "dist_backend": self.dist_backend,
            "supported_dtypes": list(facts.supported_dtypes),
            "supported_kv_cache_dtypes": list(facts.supported_kv_cache_dtypes),
            "quant_methods": list(self.quant_methods()),
            "attention_backends": list(self.attention_backends()),
            "step_replay": recorder.name if (recorder := self.step_recorder()) else None,
            "notes": list(facts.notes),
        }

    def __repr__(self) -> str:
        return f"<Platform {self.name}>"
