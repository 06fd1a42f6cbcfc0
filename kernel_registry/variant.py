"""``Variant``: one implementation of an op, with its eligibility stated as data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from hwplug.kv_cache_layout import ANY_LAYOUT, REFERENCE_LAYOUT
from hwplug.requirements import Requirements

if TYPE_CHECKING:
    from hwplug.kernel_registry.native import NativeLibrary
    from hwplug.platform_interface import Platform
    from hwplug.quantization import ScaleDescriptor

#: The keywords of :meth:`Variant.of` that are :class:`Requirements` fields.
_REQUIREMENT_FIELDS = tuple(f.name for f in fields(Requirements))
#: ``supports(*args, **kwargs)`` of a variant: None if it can serve this call, else why not.
SupportsFn = Callable[..., "str | None"]


@dataclass
class Variant:
    """An implementation of ``op`` and the facts that decide where it may run.

    ``impl`` is the callable or a lazy ``"module:function"`` (imported when first chosen).
    Facts checked once per dispatch key: its :class:`~hwplug.requirements.Requirements`
    (``platforms``: platform or family names, see :meth:`~hwplug.Platform.matches`, empty
    = any platform, on any device; ``dtypes`` of the op's dispatch tensor, empty = any;
    ``features`` the device must have; capability range, ``min_toolkit`` and ``packages``
    version gates; :meth:`of` takes them as keywords), the ``num_tokens`` range
    ``[low, high)`` of the dispatch tensor's leading dimension, and for the ops over a
    paged KV cache (``reshape_and_cache``,
    ``paged_attention``) the ``layouts`` it reads and writes: registered layout names,
    empty for the reference layout ``NHD`` alone (``"*"``, the references' claim: every
    layout). ``supports`` (a callable or a
    lazy ``"module:function"``, imported with ``impl``) is checked on every call for what
    only the call's shapes can tell; leave it None where possible. ``native`` is the
    compiled library ``impl`` calls, if any (a :class:`~hwplug.kernel_registry.native.
    NativeLibrary` or a lazy ``"module:attribute"`` naming one): importing it builds
    nothing; the registry explains from its build status and builds it when it binds the
    variant for calls. ``activation_quantization`` says how the variant rounds its
    activations before its dot products (e.g. int8 per 32 values, as llama.cpp's Q8_0), or
    None, the default, for a variant that computes with them as given: the conformance
    kit holds such a variant to its op's tight
    :attr:`~hwplug.kernel_registry.dispatch.Op.exact_tolerances`, and only a variant that
    declares its rounding to the op's wider ``tolerances``.
    """

    op: str
    name: str
    impl: Callable[..., Any] | str
    priority: int = 0
    requirements: Requirements = field(default_factory=Requirements)
    num_tokens: tuple[int, int | None] | None = None
    layouts: tuple[str, ...] = ()
    supports: SupportsFn | str | None = None
    native: NativeLibrary | str | None = None
    description: str = ""
    activation_quantization: ScaleDescriptor | None = None

    @classmethod
    def of(cls, op: str, name: str, impl: Callable[..., Any] | str, **facts: Any) -> Variant:
        """A variant from flat facts: :class:`Requirements` fields (``platforms``,
        ``dtypes``, ``min_capability``, ...) and the variant's own (``priority``,
        ``num_tokens``, ``supports``, ...)."""
        needs = {name: facts.pop(name) for name in _REQUIREMENT_FIELDS if name in facts}
        return cls(op, name, impl, requirements=Requirements(**needs), **facts)

    @property
    def key(self) -> str:
        return f"{self.op}/{self.name}"

    def load(self) -> None:
        """Import a lazy ``impl``, ``supports`` and ``native`` in place (import errors
        propagate). Nothing is built: see :attr:`native`."""
        from hwplug.kernel_registry.legacy_calls import adapt_variant
        from hwplug.registry import import_object

        if isinstance(self.impl, str):
            self.impl = adapt_variant(self.op, import_object(self.impl))
        if isinstance(self.supports, str):
            self.supports = import_object(self.supports)
        if isinstance(self.native, str):
            self.native = import_object(self.native)

    def static_rejection(self, platform: Platform, device_type: str, dtype: str,
                         num_tokens: int | None, layout: str | None = None) -> str | None:
        """Why this variant cannot serve the dispatch key, or None if it can (``layout``:
        the KV-cache layout of a cache op's call, None for other ops)."""
        device = device_type if self.requirements.platforms else None
        reasons = self.requirements.reasons(platform, dtype, device)
        if reasons:
            return reasons[0]
        served = self.layouts or (REFERENCE_LAYOUT,)
        if layout is not None and layout not in served and ANY_LAYOUT not in served:
            return f"serves layouts {', '.join(served)}, not {layout}"
        return self._tokens_rejection(num_tokens)

    def device_rejection(self, platform: Platform) -> str | None:
        """Why this variant can serve no call at all on ``platform``'s device (its platform,
        device features, capability or version gates), or None."""
        reasons = self.requirements.reasons(platform)
        return reasons[0] if reasons else None

    def _tokens_rejection(self, num_tokens: int | None) -> str | None:
        if self.num_tokens is None or num_tokens is None:
            return None
        low, high = self.num_tokens
        if num_tokens < low or (high is not None and num_tokens >= high):
            return f"num_tokens {num_tokens} outside [{low}, {high if high else 'inf'})"
        return None
