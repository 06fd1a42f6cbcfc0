"""``ModelContext`` and ``build_model``: from a checkpoint to a loaded model on the platform.

The context carries what every layer needs to build itself for the resolved platform:
the settled :class:`EngineConfig`, the attention backend class, the quant method, the
dtype and the device.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
from torch import nn

from hwplug import registries
from hwplug.attention import AttentionBackend
from hwplug.config import EngineConfig
from hwplug.discovery import current_platform
from hwplug.dtypes import AUTO, dtype_name, torch_dtype
from hwplug.errors import ModelError, UnsupportedError
from hwplug.model_zoo.layers.linear import Linear
from hwplug.model_zoo.registry import get_model_class
from hwplug.platform_interface import Platform
from hwplug.quantization import QuantMethod

logger = logging.getLogger(__name__)


@dataclass
class ModelContext:
    """Everything a layer needs to build itself for the resolved platform."""

    platform: Platform
    #: Settled by ``platform.check_and_update_config`` (dtype, backend, block size, KV dtype).
    engine_config: EngineConfig
    attention_backend: type[AttentionBackend]
    quant_method: QuantMethod
    dtype: torch.dtype
    device: torch.device


class CheckpointLike(Protocol):
    """What :func:`build_model` reads of a checkpoint (a loaders ``Checkpoint`` is one)."""

    config: Any

    def weights(self) -> Iterable[tuple[str, torch.Tensor]]: ...


def create_context(model_cls: Any, hf_config: Any, *, dtype: str = AUTO,
                   platform: Platform | None = None, attention_backend: str | None = None,
                   block_size: int | None = None, kv_cache_dtype: str | None = None
                   ) -> ModelContext:
    """Settle the engine configuration of ``model_cls`` for ``hf_config`` on ``platform``
    (default: the current one); ``dtype`` ``"auto"`` lets the platform choose, within what
    the checkpoint's ``torch_dtype`` allows. Raises :class:`UnsupportedError` when the
    platform cannot run the dtype, KV dtype, attention or quantization the model needs."""
    resolved = current_platform()  # also runs the plugins' registrations
    platform = platform or resolved
    config = replace(model_cls.engine_config(hf_config, dtype), block_size=block_size,
                     attention_backend=attention_backend, kv_cache_dtype=kv_cache_dtype,
                     checkpoint_dtype=checkpoint_dtype(hf_config))
    platform.check_and_update_config(config)
    return ModelContext(platform=platform, engine_config=config,
                        attention_backend=registries.attention_backends.get(
                            config.attention_backend),
                        quant_method=_quant_method(hf_config, platform),
                        dtype=torch_dtype(config.dtype), device=torch.device(platform.device_type))


def checkpoint_dtype(hf_config: Any) -> str | None:
    """The float dtype a Hugging Face config says its weights are stored in, or None."""
    stored = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    try:
        return dtype_name(stored) if stored is not None else None
    except UnsupportedError:
        return None


def build_model(checkpoint: CheckpointLike, *, dtype: str = AUTO,
                platform: Platform | None = None, attention_backend: str | None = None,
                block_size: int | None = None, kv_cache_dtype: str | None = None
                ) -> tuple[nn.Module, ModelContext]:
    """Build the registered model for ``checkpoint.config.architectures[0]`` on the
    platform, load ``checkpoint.weights()``, and return ``(model.eval(), ctx)``.

    Raises :class:`ModelError` when the config names no architecture or the weights do not
    match, :class:`~hwplug.errors.UnknownNameError` for an unregistered architecture.
    """
    hf_config = checkpoint.config
    architectures = getattr(hf_config, "architectures", None) or []
    if not architectures:
        raise ModelError("the checkpoint's config names no architecture "
                         "(config.architectures is empty)")
    model_cls = get_model_class(architectures[0])
    ctx = create_context(model_cls, hf_config, dtype=dtype, platform=platform,
                         attention_backend=attention_backend, block_size=block_size,
                         kv_cache_dtype=kv_cache_dtype)
    logger.info("building %s (%s) on %s with %s attention, block size %d",
                architectures[0], ctx.engine_config.dtype, ctx.platform.name,
                ctx.engine_config.attention_backend, ctx.engine_config.block_size)
    with torch.device(ctx.device):
        model = model_cls(hf_config, ctx)
    model.load_weights(checkpoint.weights())
    for module in model.modules():
        if isinstance(module, Linear):
            module.quant_method.process_weights_after_loading(module)
    return model.eval(), ctx


def _quant_method(hf_config: Any, platform: Platform) -> QuantMethod:
    quant_config = getattr(hf_config, "quantization_config", None)
    if quant_config is not None and not isinstance(quant_config, dict):
        quant_config = quant_config.to_dict()
    name = quant_config.get("quant_method", "unquantized") if quant_config else "unquantized"
    supported = platform.facts.supported_quant_methods
    if name not in supported:
        raise UnsupportedError(f"quantization {name!r} is not supported on platform "
                               f"{platform.name!r}; supported: {', '.join(supported)}")
    return registries.quant_methods.get(name).from_config(quant_config)
