"""Choosing the attention backend for a model on a platform, and settling its block size.

:func:`select_backend` asks every registered backend to :meth:`~hwplug.AttentionBackend.validate`
the model's :class:`~hwplug.attention.AttentionSpec` on the platform, then takes the first
of the platform's :meth:`~hwplug.Platform.attention_backends` that accepts (or the one the
configuration names: ``LLM(attention_backend=...)`` or ``HWPLUG_ATTENTION_BACKEND``).
:func:`settle_attention` runs it once, at configuration time, and settles the block size
with the chosen backend; a block size that no backend able to serve the model accepts is
a :class:`~hwplug.errors.ConfigError` listing the sizes they do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from hwplug import registries
from hwplug.attention import AttentionBackend, AttentionSpec
from hwplug.errors import ConfigError, UnsupportedError

if TYPE_CHECKING:
    from hwplug.config import EngineConfig
    from hwplug.platform_interface import Platform

logger = logging.getLogger(__name__)


@dataclass
class Selection:
    """The outcome of :func:`select_backend`: the chosen class and why others were not."""

    backend: type[AttentionBackend]
    rejected: dict[str, list[str]]
    forced: bool


def _backends() -> dict[str, type[AttentionBackend] | str]:
    """Every registered backend class, or why it failed to import (a reason, not a crash)."""
    result: dict[str, type[AttentionBackend] | str] = {}
    for name in registries.attention_backends.names():
        try:
            result[name] = registries.attention_backends.get(name)
        except Exception as exc:
            logger.warning("attention backend %s failed to import: %r", name, exc)
            result[name] = f"failed to import: {exc!r}"
    return result


def _rejections(platform: Platform, spec: AttentionSpec) -> dict[str, list[str]]:
    """Every registered backend's reasons for refusing ``spec`` (empty list: it can)."""
    return {name: [backend] if isinstance(backend, str) else backend.validate(spec, platform)
            for name, backend in _backends().items()}


def select_backend(platform: Platform, spec: AttentionSpec,
                   requested: str | None = None) -> Selection:
    """Choose the attention backend for ``spec`` on ``platform``.

    ``requested`` forces a backend: if it cannot serve the spec that is an error listing
    its reasons and the backends that can. Otherwise the first backend of
    ``platform.attention_backends()`` that validates wins.
    """
    reasons = _rejections(platform, spec)
    able = [name for name, why in reasons.items() if not why]
    if requested:
        backend = registries.attention_backends.get(requested)  # unknown -> lists choices
        requested = backend.get_name()  # an old name (a deprecated alias) -> the current one
        if reasons[requested]:
            raise UnsupportedError(
                f"attention backend {requested} cannot serve {spec}: "
                f"{'; '.join(reasons[requested])}. Backends that can: {', '.join(able) or 'none'}"
            )
        return Selection(backend, {n: r for n, r in reasons.items() if n != requested}, True)
    priority = list(platform.attention_backends())
    if not priority:
        raise UnsupportedError(
            f"platform {platform.name!r} declares no attention backend: its plugin has not "
            "registered one yet"
        )
    rejected: dict[str, list[str]] = {}
    for name in priority:
        why = reasons.get(name, [f"not registered (registered: {', '.join(reasons) or 'none'})"])
        if not why:
            rejected.update({n: r or ["lower in the platform's priority list"]
                             for n, r in reasons.items() if n not in rejected and n != name})
            return Selection(registries.attention_backends.get(name), rejected, False)
        rejected[name] = why
    detail = "; ".join(f"{n}: {', '.join(r)}" for n, r in rejected.items())
    raise UnsupportedError(f"no attention backend of platform {platform.name!r} can serve "
                           f"{spec}: {detail}")


def settle_attention(platform: Platform, config: EngineConfig) -> Selection:
    """Pick the backend and the block size for ``config`` once, at configuration time.

    A requested block size is part of the spec, so only backends that accept it can be
    chosen; when none that can otherwise serve the model does, that is a
    :class:`ConfigError` naming the sizes each accepts. Without one, the chosen backend's
    sizes decide (the platform default when it is among them).
    """
    spec = AttentionSpec.from_config(config)
    if config.block_size is not None:
        unsized = _rejections(platform, replace(spec, block_size=None))
        able = {name: _backends()[name] for name, why in unsized.items() if not why}
        if config.attention_backend:
            able = {n: b for n, b in able.items()
                    if n == registries.attention_backends.current_name(config.attention_backend)}
        if able and not any(config.block_size in b.supported_block_sizes for b in able.values()):
            sizes = "; ".join(f"{name} accepts {', '.join(map(str, b.supported_block_sizes))}"
                              for name, b in able.items())
            raise ConfigError(f"block_size {config.block_size} is not accepted by the attention "
                              f"backends that can serve this model: {sizes}")
    selection = select_backend(platform, spec, config.attention_backend)
    sizes = selection.backend.supported_block_sizes
    if spec.block_size is None:
        config.block_size = (platform.default_block_size
                             if platform.default_block_size in sizes else sizes[0])
    config.attention_backend = selection.backend.get_name()
    return selection


def describe_backend(backend: type[AttentionBackend]) -> dict[str, Any]:
    """A backend's declared facts as plain data (for ``hwplug info`` and the kit)."""
    return {
        "name": backend.get_name(),
        "platforms": list(backend.platforms),
        "dtypes": list(backend.supported_dtypes),
        "kv_cache_dtypes": list(backend.supported_kv_cache_dtypes),
        "head_sizes": list(backend.supported_head_sizes) or "any",
        "block_sizes": list(backend.supported_block_sizes),
        "layout": backend.kv_cache_layout,
        "is_mla": backend.is_mla,
        "updates_kv_cache_in_forward": backend.updates_kv_cache_in_forward,
        "internal_fallbacks": [f"{f.condition} -> {f.path}" for f in backend.internal_fallbacks],
    }
