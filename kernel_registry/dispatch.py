"""``Op``: a callable that sends each call to the chosen variant, cached per dispatch key.

The key is (device, dtype, num_tokens bucket) of the op's dispatch argument, plus the
KV-cache layout for the ops over a paged cache (:class:`LayoutOp`). The
first call for a key asks the registry to explain the choice and caches the result: the
variant's function itself when it has no per-call ``supports`` check (so a steady-state
call costs one dict lookup), else a small chain that falls back along the ranked order.
Any registry change empties the cache.

Binding a variant builds its native library (:meth:`~hwplug.kernel_registry.native.
NativeLibrary.ensure_built`) unless it is built, before its first call: the chosen one when
the key is resolved, a fallback the first time it accepts a call. A build that fails
rejects the variant (a warning, once per variant) and the next in the chain serves.
Explaining builds nothing.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.native import explain_build

if TYPE_CHECKING:
    from hwplug.kernel_registry.registry import KernelRegistry
    from hwplug.kernel_registry.variant import Variant

logger = logging.getLogger(__name__)


class _FallbackChain:
    """Calls the first variant whose ``supports`` accepts the call; logs each fallback once.

    A variant with a native library is built (``build``: why it cannot be, or None) the
    first time it accepts a call; one that fails to build leaves the chain."""

    def __init__(self, op: str, key: tuple[Any, ...], chain: list[Variant],
                 build: Callable[[Variant], str | None]) -> None:
        self.op, self.key, self.chain, self.build = op, key, chain, build
        self.logged: set[str] = set()
        #: Names of the variants that have served a call.
        self.used: set[str] = set()
        #: Names of the variants whose native library is not bound yet.
        self.unbuilt = {v.name for v in chain if v.native is not None}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        reasons = []
        for variant in self.chain:
            reason = variant.supports(*args, **kwargs) if variant.supports else None
            if reason is None and self.unbuilt and variant.name in self.unbuilt:
                reason = self._bind(variant)
            if reason is None:
                self.used.add(variant.name)
                if reasons and variant.name not in self.logged:
                    self.logged.add(variant.name)
                    logger.info("%s %s: falling back to %s (%s)", self.op, self.key,
                                variant.name, "; ".join(reasons))
                return variant.impl(*args, **kwargs)  # type: ignore[operator]
            reasons.append(f"{variant.name}: {reason}")
        raise UnsupportedError(f"no variant of {self.op} can serve this call: "
                               f"{'; '.join(reasons)}")

    def _bind(self, variant: Variant) -> str | None:
        """Build ``variant``'s native library; drop the variant if that fails (why)."""
        self.unbuilt.discard(variant.name)
        reason = self.build(variant)
        if reason is not None:
            self.chain = [v for v in self.chain if v is not variant]
        return reason


class Op:
    """One declared op. Call it like its reference; ``__doc__`` is its contract."""

    #: Position of the :class:`~hwplug.attention.PagedAttentionParams` argument of an op
    #: over a paged KV cache (see :class:`LayoutOp`); None for the others.
    layout_arg: int | None = None

    def __init__(self, registry: KernelRegistry, name: str, doc: str,
                 tolerances: dict[str, tuple[float, float]], dispatch_arg: int) -> None:
        self.registry, self.name, self.__doc__ = registry, name, doc
        self.tolerances, self.dispatch_arg = tolerances, dispatch_arg
        self._cache: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self._first_choice: dict[tuple[Any, ...], str] = {}
        self._edges: list[int] = []
        #: Keys of the variants whose failed native build was warned about (once each).
        self._warned: set[str] = set()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        x = args[self.dispatch_arg]
        key = (x.device, x.dtype,
               bisect.bisect_right(self._edges, x.shape[0]) if self._edges else 0)
        try:
            target = self._cache[key]
        except KeyError:
            target = self._resolve(key)
        return target(*args, **kwargs)

    def reference(self, *args: Any, **kwargs: Any) -> Any:
        """Call the pure-torch reference directly (the numerical oracle)."""
        from hwplug.kernel_registry.registry import REFERENCE

        variant = self.registry.get(f"{self.name}/{REFERENCE}")
        variant.load()
        return variant.impl(*args, **kwargs)  # type: ignore[operator]

    def variants_used(self) -> set[str]:
        """Names of the variants that served this op's calls since the last change."""
        used = set()
        for key, target in self._cache.items():
            used |= (target.used if isinstance(target, _FallbackChain)
                     else {self._first_choice[key]})
        return used

    def invalidate(self) -> None:
        """Forget cached choices (the registry calls this on every change)."""
        self._cache, self._first_choice = {}, {}
        edges = set()
        for variant in self.registry.variants(self.name):
            if variant.num_tokens is not None:
                low, high = variant.num_tokens
                edges.update(e for e in (low, high) if e is not None)
        self._edges = sorted(edges)

    def bucket_tokens(self, bucket: int) -> int | None:
        """A representative num_tokens of bucket index ``bucket`` (None: not bucketed)."""
        if not self._edges:
            return None
        return self._edges[bucket - 1] if bucket > 0 else 0

    def _resolve(self, key: tuple[Any, ...]) -> Callable[..., Any]:
        from hwplug.discovery import current_platform
        from hwplug.dtypes import dtype_name

        device, dtype, bucket, *layout = key
        device_type = device.type
        try:
            dtype_text = dtype_name(dtype)
        except UnsupportedError:
            dtype_text = str(dtype).removeprefix("torch.")
        explanation = self.registry.explain(self.name, current_platform(), device_type,
                                            dtype_text, self.bucket_tokens(bucket),
                                            layout=layout[0].name if layout else None)
        chain = explanation.chain
        while chain and chain[0].supports is None and (reason := self._build(chain[0])):
            explanation.rejected[chain.pop(0).name] = reason  # it would serve every call
        if not chain:
            detail = "; ".join(f"{n}: {r}" for n, r in explanation.rejected.items())
            where = f" in layout {explanation.layout}" if explanation.layout else ""
            raise UnsupportedError(f"no variant of {self.name} can serve {device_type} "
                                   f"{dtype_text}{where}: {detail}")
        target = (chain[0].impl if chain[0].supports is None
                  else _FallbackChain(self.name, key, chain, self._build))
        logger.debug("%s %s -> %s", self.name, key, chain[0].name)
        self._first_choice[key] = chain[0].name
        self._cache[key] = target  # type: ignore[assignment]
        return target  # type: ignore[return-value]

    def _build(self, variant: Variant) -> str | None:
        """Bind ``variant``: build and load its native library, if it has one, unless its
        status rules that out (a remembered failure; not built under
        ``HWPLUG_BUILD_KERNELS=never``). Why it cannot serve, or None; the first failure of
        each variant is logged as a warning."""
        if variant.native is None:
            return None
        native = variant.native
        try:
            reason, _ = explain_build(native)  # type: ignore[arg-type]
            if reason is None:
                native.ensure_built()  # type: ignore[union-attr]
        except Exception as exc:  # a build that fails rejects the variant, never the call
            reason = f"not built: {exc}"
        if reason is not None and variant.key not in self._warned:
            self._warned.add(variant.key)
            logger.warning("kernel variant %s is not used: %s", variant.key, reason)
        return reason

class LayoutOp(Op):
    """An op over a paged KV cache (``reshape_and_cache``, ``paged_attention``): the layout
    of its :class:`~hwplug.attention.PagedAttentionParams` argument (positional argument
    ``layout_arg``, or keyword ``params``) joins the dispatch key, so a variant serves
    only the layouts it declares (see :attr:`~hwplug.kernel_registry.Variant.layouts`)."""

    def __init__(self, registry: KernelRegistry, name: str, doc: str,
                 tolerances: dict[str, tuple[float, float]], dispatch_arg: int,
                 layout_arg: int) -> None:
        super().__init__(registry, name, doc, tolerances, dispatch_arg)
        self.layout_arg = layout_arg

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        x = args[self.dispatch_arg]
        params = args[self.layout_arg] if len(args) > self.layout_arg else kwargs["params"]
        key = (x.device, x.dtype,
               bisect.bisect_right(self._edges, x.shape[0]) if self._edges else 0,
               params.layout)
        try:
            target = self._cache[key]
        except KeyError:
            target = self._resolve(key)
        return target(*args, **kwargs)
