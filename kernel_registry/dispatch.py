"""``Op``: a callable that sends each call to the chosen variant, cached per dispatch key.

The key is (device, dtype, num_tokens bucket) of the op's dispatch argument. The
first call for a key asks the registry to explain the choice and caches the result: the
variant's function itself when it has no per-call ``supports`` check (so a steady-state
call costs one dict lookup), else a small chain that falls back along the ranked order.
Any registry change empties the cache.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hwplug.errors import UnsupportedError

if TYPE_CHECKING:
    from hwplug.kernel_registry.registry import KernelRegistry
    from hwplug.kernel_registry.variant import Variant

logger = logging.getLogger(__name__)


class _FallbackChain:
    """Calls the first variant whose ``supports`` accepts the call; logs each fallback once."""

    def __init__(self, op: str, key: tuple[Any, ...], chain: list[Variant]) -> None:
        self.op, self.key, self.chain = op, key, chain
        self.logged: set[str] = set()
        #: Names of the variants that have served a call.
        self.used: set[str] = set()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        reasons = []
        for variant in self.chain:
            reason = variant.supports(*args, **kwargs) if variant.supports else None
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


class Op:
    """One declared op. Call it like its reference; ``__doc__`` is its contract."""

    def __init__(self, registry: KernelRegistry, name: str, doc: str,
                 tolerances: dict[str, tuple[float, float]], dispatch_arg: int) -> None:
        self.registry, self.name, self.__doc__ = registry, name, doc
        self.tolerances, self.dispatch_arg = tolerances, dispatch_arg
        self._cache: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self._first_choice: dict[tuple[Any, ...], str] = {}
        self._edges: list[int] = []

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

        device, dtype, bucket = key
        device_type = device.type
        try:
            dtype_text = dtype_name(dtype)
        except UnsupportedError:
            dtype_text = str(dtype).removeprefix("torch.")
        explanation = self.registry.explain(self.name, current_platform(), device_type,
                                            dtype_text, self.bucket_tokens(bucket))
        if not explanation.chain:
            detail = "; ".join(f"{n}: {r}" for n, r in explanation.rejected.items())
            raise UnsupportedError(f"no variant of {self.name} can serve {device_type} "
                                   f"{dtype_text}: {detail}")
        chain = explanation.chain
        target = (chain[0].impl if chain[0].supports is None
                  else _FallbackChain(self.name, key, chain))
        logger.debug("%s %s -> %s", self.name, key, chain[0].name)
        self._first_choice[key] = chain[0].name
        self._cache[key] = target  # type: ignore[assignment]
        return target  # type: ignore[return-value]
