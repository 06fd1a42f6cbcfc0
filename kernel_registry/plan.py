"""``KernelPlan``: the kernels a model runs, chosen once when it is built.

A plan belongs to one platform and one :class:`KernelPolicy`. A layer binds each op it
calls when it is constructed (:meth:`KernelPlan.bind`: the op, the dtype of the tensor
it dispatches on and, for the ops over a paged KV cache, the cache's layout); the
:class:`BoundOp` it gets holds one implementation per token bucket of the op (the
ranges its variants' ``num_tokens`` declare), chosen then, with their native libraries
built (a failed build falls back, once, with a warning). A call costs a bisect of the
token count and the call itself; nothing is resolved again. Where a chosen variant
checks each call (``supports``), the bucket holds the ranked chain instead, which falls
back call by call. The registry changing later does not change a plan already made: a
model sees the kernels registered when it was built.

:meth:`KernelPlan.rows` reports the plan (``hwplug generate --verbose``,
``hwplug kernels --model``): per op, dtype and layout, the variant per bucket, its
fallbacks, and which variants have served calls.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hwplug import envs
from hwplug.dtypes import named_torch_dtype
from hwplug.errors import ConfigError, UnsupportedError
from hwplug.kernel_registry.native import explain_build

if TYPE_CHECKING:
    from hwplug.kernel_registry.registry import KernelRegistry
    from hwplug.kernel_registry.variant import Variant
    from hwplug.platform_interface import Platform

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelPolicy:
    """How variants are chosen beyond their own facts, resolved once: ``disabled``
    variants (``op/name`` keys or bare names) are never chosen, ``preferred`` ranks an op's
    named variants first (op -> names, best first), and ``strict`` forbids falling back
    from the first eligible variant."""

    disabled: frozenset[str] = frozenset()
    preferred: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    strict: bool = False

    @classmethod
    def from_env(cls) -> KernelPolicy:
        """``HWPLUG_DISABLED_KERNELS``, ``HWPLUG_PREFERRED_KERNELS`` and
        ``HWPLUG_STRICT_KERNELS`` as they are set now."""
        return cls(frozenset(envs.HWPLUG_DISABLED_KERNELS),
                   dict(envs.HWPLUG_PREFERRED_KERNELS), envs.HWPLUG_STRICT_KERNELS)

    def check(self, registry: KernelRegistry) -> None:
        """Raise :class:`ConfigError` naming what this policy names that ``registry``
        lacks: a variant, an op, or an op's variant (with the known ones)."""
        keys = {e.name for e in registry.entries()}
        short = {key.split("/", 1)[1] for key in keys}
        unknown = sorted(n for n in self.disabled if n not in keys and n not in short)
        if unknown:
            raise ConfigError(
                f"HWPLUG_DISABLED_KERNELS names unknown kernel variants: {', '.join(unknown)}; "
                f"known: {', '.join(sorted(keys))}")
        ops = registry.ops()
        unknown_ops = [op for op in self.preferred if op not in ops]
        if unknown_ops:
            raise ConfigError(f"HWPLUG_PREFERRED_KERNELS names unknown ops: "
                              f"{', '.join(unknown_ops)}; known ops: {', '.join(ops)}")
        for op, preferred in self.preferred.items():
            names = [v.name for v in registry.variants(op)]
            unknown = [p for p in preferred if p not in names]
            if unknown:
                raise ConfigError(f"HWPLUG_PREFERRED_KERNELS names unknown variants of {op}: "
                                  f"{', '.join(unknown)}; known: {', '.join(names)}")

    def disables(self, variant: Variant) -> bool:
        return variant.key in self.disabled or variant.name in self.disabled


class FallbackChain:
    """Calls the first variant of ``chain`` whose ``supports`` accepts the call, logging each
    fallback once. A variant with a native library is built (``build``: why it cannot be,
    or None) the first time it accepts a call; one that fails to build leaves the chain.
    Each variant that serves a call is added to :attr:`used` and to ``record`` (the op's
    record across plans)."""

    def __init__(self, op: str, chain: list[Variant],
                 build: Callable[[Variant], str | None], record: set[str]) -> None:
        self.op, self.chain, self.build, self.record = op, chain, build, record
        self.logged: set[str] = set()
        #: Names of the variants that have served a call.
        self.used: set[str] = set()
        #: Names of the variants whose native library is not built yet.
        self.unbuilt = {v.name for v in chain if v.native is not None}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        reasons = []
        for variant in self.chain:
            reason = variant.supports(*args, **kwargs) if variant.supports else None
            if reason is None and self.unbuilt and variant.name in self.unbuilt:
                self.unbuilt.discard(variant.name)
                reason = self.build(variant)
                if reason is not None:
                    self.chain = [v for v in self.chain if v is not variant]
            if reason is None:
                if variant.name not in self.used:
                    self.used.add(variant.name)
                    self.record.add(variant.name)
                if reasons and variant.name not in self.logged:
                    self.logged.add(variant.name)
                    logger.info("%s: falling back to %s (%s)", self.op, variant.name,
                                "; ".join(reasons))
                return variant.impl(*args, **kwargs)  # type: ignore[operator]
            reasons.append(f"{variant.name}: {reason}")
        raise UnsupportedError(f"no variant of {self.op} can serve this call: "
                               f"{'; '.join(reasons)}")


@dataclass
class Bucket:
    """One token range ``[low, high)`` of a bound op (``high`` None: no bound) and what
    serves it: the chosen variant's implementation, or a :class:`FallbackChain`."""

    low: int
    high: int | None
    chain: list[Variant]
    target: Callable[..., Any]
    #: Whether a call has come to this bucket.
    called: bool = False

    @property
    def chosen(self) -> str:
        return self.chain[0].name

    def used(self) -> set[str]:
        """The variants that have served calls of this bucket."""
        if isinstance(self.target, FallbackChain):
            return set(self.target.used)
        return {self.chosen} if self.called else set()


class BoundOp:
    """One op bound for calls whose dispatch tensor has ``dtype`` (and, for an op over a
    paged cache, whose cache has ``layout``) on a plan's platform. Call it like the op; a
    dispatch tensor of another dtype is refused (:class:`UnsupportedError`), never handed
    to a kernel chosen for ``dtype``. A bucket's first call is added to ``record`` (the
    op's record of what served it, across plans)."""

    def __init__(self, op: str, dtype: str, layout: str | None, dispatch_arg: int,
                 buckets: list[Bucket], record: set[str]) -> None:
        self.op, self.dtype, self.layout = op, dtype, layout
        self.dispatch_arg, self.buckets, self.record = dispatch_arg, buckets, record
        self._torch_dtype = named_torch_dtype(dtype)
        self._edges = [bucket.low for bucket in buckets[1:]]
        self._targets = [self._first_call(i) for i in range(len(buckets))]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        x = args[self.dispatch_arg]
        if x.dtype is not self._torch_dtype:
            raise UnsupportedError(f"{self.op} was bound for {self.dtype} and called with "
                                   f"{str(x.dtype).removeprefix('torch.')}")
        if len(self._targets) == 1:
            return self._targets[0](*args, **kwargs)
        return self._targets[bisect.bisect_right(self._edges, x.shape[0])](*args, **kwargs)

    def _first_call(self, index: int) -> Callable[..., Any]:
        """A target that records that bucket ``index`` served a call, then puts the
        bucket's own target in its place (steady-state calls pay nothing for it)."""
        bucket = self.buckets[index]

        def first(*args: Any, **kwargs: Any) -> Any:
            bucket.called = True
            if not isinstance(bucket.target, FallbackChain):
                self.record.add(bucket.chosen)
            self._targets[index] = bucket.target
            return bucket.target(*args, **kwargs)
        return first

    def used(self) -> set[str]:
        """The variants that have served this op's calls."""
        return set().union(*(bucket.used() for bucket in self.buckets))

    def chosen(self) -> tuple[str, ...]:
        """The variant chosen for each token bucket, in bucket order (the first of its
        fallbacks: a call it declines may still fall back)."""
        return tuple(bucket.chosen for bucket in self.buckets)

    def describe(self) -> str:
        """``"gemv_avx2 [1, 2), gemm_avx2 [2, inf)"``: the chosen variant per bucket (one
        bucket: its name alone; fallbacks after ``>``)."""
        parts = []
        for bucket in self.buckets:
            text = " > ".join(v.name for v in bucket.chain)
            if len(self.buckets) > 1:
                text += f" [{bucket.low}, {bucket.high if bucket.high is not None else 'inf'})"
            parts.append(text)
        return ", ".join(parts)


class KernelPlan:
    """The kernels of the models built for ``platform`` under ``policy`` (default: the
    ``HWPLUG_*_KERNELS`` variables now), from ``registry``. With ``build=False`` the plan
    only explains: it builds no native library (a variant whose library is not built yet
    stays chosen, noted "built on first use"), for reports that must have no side effects.
    """

    def __init__(self, registry: KernelRegistry, platform: Platform,
                 policy: KernelPolicy | None = None, *, build: bool = True) -> None:
        self.registry, self.platform = registry, platform
        self.policy = policy if policy is not None else KernelPolicy.from_env()
        self.policy.check(registry)
        self.build = build
        self._bound: dict[tuple[str, str, str | None, str], BoundOp] = {}
        #: variant key -> why its native library cannot serve (None: built), once each.
        self._builds: dict[str, str | None] = {}

    def bind(self, op: str, dtype: str, layout: str | None = None,
             device_type: str | None = None) -> BoundOp:
        """``op`` bound for dispatch tensors of ``dtype`` on ``device_type`` (default: the
        platform's) and, for an op over a paged cache, caches of ``layout``. Bound once per
        plan and key; raises :class:`UnsupportedError` when no variant can serve a bucket."""
        key = (op, dtype, layout, device_type or self.platform.device_type)
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound[key] = self._bind(*key)
        return bound

    def _bind(self, name: str, dtype: str, layout: str | None, device_type: str) -> BoundOp:
        op = self.registry.op(name)
        edges = op.token_edges()
        buckets = []
        for low, high in zip([0, *edges], [*edges, None], strict=True):
            explanation = self.registry.explain(name, self.platform, device_type, dtype,
                                                low if edges else None, layout=layout,
                                                policy=self.policy)
            chain = explanation.chain
            while self.build and chain and chain[0].supports is None and (
                    reason := self._build(chain[0])):
                explanation.rejected[chain.pop(0).name] = reason  # it would serve every call
            if not chain:
                detail = "; ".join(f"{n}: {r}" for n, r in explanation.rejected.items())
                where = f" in layout {layout}" if layout else ""
                raise UnsupportedError(f"no variant of {name} can serve {device_type} "
                                       f"{dtype}{where}: {detail}")
            target = (chain[0].impl if chain[0].supports is None
                      else FallbackChain(name, chain, self._build if self.build else _built,
                                         op.used))
            buckets.append(Bucket(low, high, chain, target))  # type: ignore[arg-type]
            logger.debug("%s %s %s tokens [%d, %s) -> %s", name, dtype, layout or "", low,
                         high, chain[0].name)
        return BoundOp(name, dtype, layout, op.dispatch_arg, buckets, op.used)

    def _build(self, variant: Variant) -> str | None:
        """Build and load ``variant``'s native library, if it has one, unless its status
        rules that out (a remembered failure; not built under
        ``HWPLUG_BUILD_KERNELS=never``). Why it cannot serve, or None; the first failure of
        each variant is logged as a warning."""
        if variant.native is None:
            return None
        if variant.key in self._builds:
            return self._builds[variant.key]
        native = variant.native
        try:
            reason, _ = explain_build(native)  # type: ignore[arg-type]
            if reason is None:
                native.ensure_built()  # type: ignore[union-attr]
        except Exception as exc:  # a build that fails rejects the variant, never the call
            reason = f"not built: {exc}"
        if reason is not None:
            logger.warning("kernel variant %s is not used: %s", variant.key, reason)
        self._builds[variant.key] = reason
        return reason

    def bound(self) -> list[BoundOp]:
        """Every op bound so far, in binding order."""
        return list(self._bound.values())

    def used(self) -> dict[str, set[str]]:
        """op -> the variants that have served its calls (ops that served none left out)."""
        used: dict[str, set[str]] = {}
        for bound in self._bound.values():
            if names := bound.used():
                used.setdefault(bound.op, set()).update(names)
        return used


def _built(variant: Variant) -> None:
    """An explaining plan's stand-in for a build: nothing is built, nothing rejected."""
    return None
