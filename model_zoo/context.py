"""``ModelContext`` and ``build_model``: from a checkpoint to a loaded model on the platform.

The context is handed to every layer when the model is built and carries what a layer
needs to build itself for the platform: the platform, the settled :class:`EngineConfig`,
the attention backend class, the quant method, the dtype and device, this process's
share under tensor parallelism (with its communicator), and the kernel plan the layers
bind their ops from (:class:`~hwplug.kernel_registry.KernelPlan`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import nn

from hwplug import registries
from hwplug.attention import AttentionBackend
from hwplug.config import EngineConfig
from hwplug.dtypes import dtype_name, torch_dtype
from hwplug.errors import ConfigError, ModelError, UnsupportedError
from hwplug.kernel_registry import BoundOp, KernelPlan, KernelPolicy, kernels
from hwplug.model_zoo.llm_config import LLMConfig
from hwplug.model_zoo.loaders import repacked_cache
from hwplug.model_zoo.loaders.memory import (
    check_memory,
    estimate_memory,
    resolve_max_model_len,
)
from hwplug.model_zoo.parallel import TensorParallel
from hwplug.model_zoo.quant_methods import quant_method_for
from hwplug.model_zoo.registry import get_model_class
from hwplug.platform_interface import Platform
from hwplug.quantization import QuantMethod

__all__ = ["CheckpointLike", "ModelContext", "build_model", "create_context"]

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
    #: The kernels the model's layers bind when they are built (one plan per model).
    kernels: KernelPlan
    #: This process's share of the model under tensor parallelism (size 1: all of it).
    parallel: TensorParallel = field(default_factory=TensorParallel)
    #: The longest sequence served (``LLMConfig.max_model_len`` resolved): positions are
    #: below it, so tables per position (RoPE) need no more rows. None: the model's context.
    max_model_len: int | None = None

    def bind(self, op: str, dtype: str | None = None, layout: str | None = None) -> BoundOp:
        """``op`` bound from this model's plan for dispatch tensors of ``dtype`` (default:
        the model dtype) and, for a cache op, caches of ``layout``."""
        return self.kernels.bind(op, dtype or self.engine_config.dtype, layout)


class CheckpointLike(Protocol):
    """What :func:`build_model` reads of a checkpoint (a loaders ``Checkpoint`` is one)."""

    config: Any

    def weights(self) -> Iterable[tuple[str, torch.Tensor]]: ...


@dataclass
class InMemoryCheckpoint:
    """A checkpoint held in memory (a :class:`CheckpointLike`): a Hugging Face ``config``
    and the ``state`` dict of a model built in code (a test's, the conformance kit's)."""

    config: Any
    state: dict[str, torch.Tensor]

    def weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        return iter(self.state.items())


#: The :class:`LLMConfig` options that shape a model's build (the others shape the engine).
ENGINE_OPTIONS = ("dtype", "kv_cache_dtype", "block_size", "attention_backend",
                  "calculate_kv_scales", "kv_scale_granularity")


def create_context(model_cls: Any, hf_config: Any, platform: Platform,
                   config: LLMConfig | None = None, parallel: TensorParallel | None = None,
                   policy: KernelPolicy | None = None) -> ModelContext:
    """Settle the engine configuration of ``model_cls`` for ``hf_config`` on ``platform``
    from the checked ``config`` (default: every option's default). ``dtype`` ``"auto"``
    lets the platform choose, within what the checkpoint's ``torch_dtype`` allows. Under
    tensor ``parallel``ism the settled attention geometry is this rank's share of the
    heads. The model's kernel plan follows ``policy`` (default: the ``HWPLUG_*_KERNELS``
    variables now). Raises :class:`ConfigError` for heads that do not split over the ranks
    or a policy naming unknown kernels or a ``max_model_len`` beyond the context, and
    :class:`UnsupportedError` when the platform cannot run the dtype, KV dtype, attention
    or quantization the model needs."""
    config = config or LLMConfig()
    parallel = parallel or TensorParallel()
    engine = replace(model_cls.engine_config(hf_config, config.dtype),
                     checkpoint_dtype=checkpoint_dtype(hf_config),
                     **{name: getattr(config, name) for name in ENGINE_OPTIONS
                        if name != "dtype"})
    engine = replace(engine, num_heads=parallel.share(engine.num_heads, "attention heads")[1],
                     num_kv_heads=parallel.kv_heads(engine.num_heads, engine.num_kv_heads)[1])
    platform.check_and_update_config(engine)
    max_model_len, _ = resolve_max_model_len(config.max_model_len,
                                             int(hf_config.max_position_embeddings))
    return ModelContext(platform=platform, engine_config=engine,
                        attention_backend=registries.attention_backends.get(
                            engine.attention_backend),
                        quant_method=_quant_method(hf_config, platform, engine.dtype),
                        dtype=torch_dtype(engine.dtype), device=torch.device(platform.device_type),
                        kernels=KernelPlan(kernels, platform, policy or KernelPolicy.from_env()),
                        parallel=parallel, max_model_len=max_model_len)


def checkpoint_dtype(hf_config: Any) -> str | None:
    """The float dtype a Hugging Face config says its weights are stored in, or None."""
    # transformers >= 4.56 names it ``dtype`` (reading ``torch_dtype`` there warns)
    name = "dtype" if hasattr(hf_config, "dtype") else "torch_dtype"
    stored = getattr(hf_config, name, None)
    try:
        return dtype_name(stored) if stored is not None else None
    except UnsupportedError:
        return None


def build_model(checkpoint: CheckpointLike, *, platform: Platform | None = None,
                parallel: TensorParallel | None = None, config: LLMConfig | None = None,
                **options: Any) -> tuple[nn.Module, ModelContext]:
    """Build the registered model for ``checkpoint.config.architectures[0]`` on
    ``platform`` (default: the current one, discovered on first use), load
    ``checkpoint.weights()``, and return ``(model.eval(), ctx)``.

    The build follows ``config`` (an :class:`LLMConfig`), or ``options``: keyword
    :data:`ENGINE_OPTIONS` checked as ``LLM`` checks them. Raises :class:`ModelError` when
    the config names no architecture, the weights do not match, or the model and the KV
    cache of one sequence of ``max_model_len`` tokens would not fit in the platform's free
    memory (checked before allocating, see :mod:`hwplug.model_zoo.loaders.memory`; a
    :class:`ConfigError` naming ``max_model_len`` when the weights alone fit);
    :class:`~hwplug.errors.UnknownNameError` for an unregistered architecture;
    :class:`ConfigError` for an option that is not an engine option or not valid.
    """
    if platform is None:
        from hwplug.discovery import current_platform  # build_model is an entry point

        platform = current_platform()
    not_engine = sorted(set(options) - set(ENGINE_OPTIONS))
    if not_engine:
        raise ConfigError(f"build_model takes the engine options {', '.join(ENGINE_OPTIONS)}; "
                          f"not {', '.join(not_engine)}")
    if config is None:
        config = LLMConfig.create(**options)
    elif options:
        raise ConfigError("give build_model a config or options, not both")
    hf_config = checkpoint.config
    architectures = getattr(hf_config, "architectures", None) or []
    if not architectures:
        raise ModelError("the checkpoint's config names no architecture "
                         "(config.architectures is empty)")
    model_cls = get_model_class(architectures[0])
    ctx = create_context(model_cls, hf_config, platform, config, parallel)
    logger.info("building %s (%s) on %s with %s attention, block size %d",
                architectures[0], ctx.engine_config.dtype, ctx.platform.name,
                ctx.engine_config.attention_backend, ctx.engine_config.block_size)
    # before allocating: the weights and one sequence of max_model_len tokens
    check_memory(estimate_memory(model_cls, hf_config, ctx, ctx.max_model_len), ctx.platform)
    with torch.device(ctx.device):
        model = model_cls(hf_config, ctx)
    logger.info("quantization %s", quantization_report(ctx))
    model.load_weights(checkpoint.weights())
    with repacked_cache.caching():  # repacked GGUF runs: mapped from disk after the first load
        for module in model.modules():  # linear layers and vocabulary tables
            if hasattr(module, "quant_method"):
                module.quant_method.process_weights_after_loading(module)
    return model.eval(), ctx


def quantization_report(ctx: ModelContext) -> str:
    """The quant method, its scheme and what the model's plan bound for its GEMM (the
    variant per token bucket; call after the model is built)."""
    method = ctx.quant_method
    bound = [op.describe() for op in ctx.kernels.bound() if op.op == method.gemm_op]
    return f"{method.describe()}, {method.gemm_op} served by {'; '.join(bound) or 'none'}"


def _quant_method(hf_config: Any, platform: Platform, dtype: str) -> QuantMethod:
    quant_config = getattr(hf_config, "quantization_config", None)
    if quant_config is not None and not isinstance(quant_config, dict):
        quant_config = quant_config.to_dict()
    return quant_method_for(quant_config, platform, dtype)
