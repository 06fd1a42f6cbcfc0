"""``KernelRegistry``: ops, their variants, and the explainable choice between them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hwplug import registries
from hwplug.errors import DuplicateNameError, UnknownNameError
from hwplug.kernel_registry.dispatch import REFERENCE, LayoutOp, Op
from hwplug.kernel_registry.native import NativeLibrary, explain_build
from hwplug.kernel_registry.plan import KernelPlan, KernelPolicy
from hwplug.kernel_registry.variant import Variant
from hwplug.kv_cache_layout import ANY_LAYOUT, REFERENCE_LAYOUT
from hwplug.registry import Registry, current_source

if TYPE_CHECKING:
    from hwplug.platform_interface import Platform

logger = logging.getLogger(__name__)

#: The reference variant sorts after every registered variant.
REFERENCE_PRIORITY = -(10**9)


@dataclass
class Explanation:
    """Why each variant of ``op`` was or was not chosen for one dispatch key.

    ``chain``: the eligible variants, best first; ``rejected``: variant name -> why not;
    ``notes``: variant name -> what else to know of an eligible one (its native library
    not built yet: :data:`~hwplug.kernel_registry.native.BUILT_ON_FIRST_USE`).
    """

    op: str
    device_type: str
    dtype: str
    num_tokens: int | None
    chain: list[Variant] = field(default_factory=list)  # eligible, best first
    layout: str | None = None
    rejected: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def chosen(self) -> Variant | None:
        return self.chain[0] if self.chain else None


class KernelRegistry(Registry[Variant]):
    """Kernel variants keyed ``"op/variant"``, and the :class:`Op` objects that dispatch."""

    #: Name of every op's pure-torch reference variant (the conformance oracle).
    REFERENCE = REFERENCE

    def __init__(self, filler: str | None = None) -> None:
        super().__init__("kernel variant", filler)
        self._ops: dict[str, Op] = {}
        self._default_plan: KernelPlan | None = None

    # --- declaring ops and variants -----------------------------------------------

    def define_op(self, name: str, reference: Callable[..., Any] | str, *, doc: str,
                  tolerances: dict[str, tuple[float, float]], dispatch_arg: int = 0,
                  layout_arg: int | None = None,
                  exact_tolerances: dict[str, tuple[float, float]] | None = None) -> Op:
        """Declare op ``name`` with its pure-torch ``reference`` (registered as variant
        ``"reference"``) and the ``(atol, rtol)`` per dtype every variant must meet;
        ``exact_tolerances``, tighter, are what a variant that does not quantize the
        activations must meet (an op whose ``tolerances`` allow activation rounding states
        them; default: ``tolerances``).
        ``dispatch_arg`` is the positional argument whose device, dtype and leading
        dimension (num_tokens) form the dispatch key. An op over a paged KV cache gives
        ``layout_arg``, the position of its :class:`~hwplug.attention.PagedAttentionParams`:
        the params' layout joins the key, each variant serves the ``layouts`` it declares,
        and the reference (converting through ``NHD``) serves every layout."""
        if name in self._ops:
            raise DuplicateNameError(f"op {name!r} is already defined")
        op = (Op(self, name, doc, tolerances, dispatch_arg) if layout_arg is None
              else LayoutOp(self, name, doc, tolerances, dispatch_arg, layout_arg))
        if exact_tolerances is not None:
            op.exact_tolerances = exact_tolerances
        self._ops[name] = op
        token = current_source.set("code")
        try:
            self.register_variant(name, REFERENCE, reference, priority=REFERENCE_PRIORITY,
                                  layouts=() if layout_arg is None else (ANY_LAYOUT,),
                                  description="pure-torch reference (runs on any device)")
        finally:
            current_source.reset(token)
        return op

    def register_variant(self, op: str, name: str, impl: Callable[..., Any] | str, *,
                         override: bool = False, **facts: Any) -> Variant:
        """Register ``impl`` as variant ``name`` of ``op``; ``facts`` are :class:`Variant`
        fields and :class:`~hwplug.requirements.Requirements` fields (``priority``,
        ``platforms``, ``dtypes``, ``min_capability``, ...), see :meth:`Variant.of`."""
        self.op(op)  # unknown op -> error listing the ops
        variant = Variant.of(op, name, impl, **facts)
        self.register(variant.key, variant, override=override)
        return variant

    def variant(self, op: str, name: str | None = None, **facts: Any
                ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`register_variant` (name defaults to the function's)."""
        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.register_variant(op, name or fn.__name__, fn, **facts)
            return fn
        return decorate

    # --- lookup ---------------------------------------------------------------------

    def op(self, name: str) -> Op:
        try:
            return self._ops[name]
        except KeyError:
            raise UnknownNameError("op", name, self._ops) from None

    def ops(self) -> dict[str, Op]:
        return dict(self._ops)

    def variants(self, op: str) -> list[Variant]:
        """``op``'s variants, in default preference order (priority, then name)."""
        found = [e.target for e in self.entries()
                 if e.status != "removed" and e.target.op == op]
        return sorted(found, key=lambda v: (-v.priority, v.name))

    def _changed(self) -> None:
        super()._changed()
        self._default_plan = None
        for op in self._ops.values():
            op.invalidate()

    # --- selection --------------------------------------------------------------------

    def explain(self, op: str, platform: Platform, device_type: str, dtype: str,
                num_tokens: int | None = None, layout: str | None = None,
                policy: KernelPolicy | None = None) -> Explanation:
        """Rank ``op``'s variants for one dispatch key, with a reason for each rejection.
        ``layout`` is the KV-cache layout of an op over a paged cache (default: the
        reference ``NHD``); other ops have none. ``policy`` (default: the
        ``HWPLUG_*_KERNELS`` variables now, checked) disables, ranks and forbids fallbacks.

        No side effects beyond importing the eligible variants: a variant's native library
        is judged by its build status alone (no compiler runs here). A remembered build
        failure rejects the variant; a library not built yet leaves it eligible with the
        note "built on first use", unless ``HWPLUG_BUILD_KERNELS=never`` rejects it.
        """
        if self.op(op).layout_arg is None:
            layout = None  # only the ops over a paged cache have one
        elif layout is None:
            layout = REFERENCE_LAYOUT
        if policy is None:
            policy = KernelPolicy.from_env()
            policy.check(self)
        result = Explanation(op, device_type, dtype, num_tokens, layout=layout)
        for variant in self._preferred_order(op, policy):
            reason = ("disabled by HWPLUG_DISABLED_KERNELS" if policy.disables(variant)
                      else variant.static_rejection(platform, device_type, dtype, num_tokens,
                                                    layout))
            if reason is None:
                reason = _import_failure(variant)
            if reason is None and variant.native is not None:
                reason, note = _build_state(variant)
                if note:
                    result.notes[variant.name] = note
            if reason is None:
                result.chain.append(variant)
            else:
                result.rejected[variant.name] = reason
        if policy.strict and len(result.chain) > 1:
            for variant in result.chain[1:]:
                result.rejected[variant.name] = "no fallback: HWPLUG_STRICT_KERNELS is set"
            del result.chain[1:]
        return result

    def native_libraries(self, platform: Platform) -> list[tuple[NativeLibrary, list[str]]]:
        """The native libraries that the variants serving ``platform``'s device need
        (platform, device features, capability and version gates met; dtypes aside), each
        once, with the keys of the variants needing it, by op and preference; a library made
        of several (its ``parts``, see :class:`~hwplug.kernel_registry.native.NativeLibrary`)
        counts as those. Imports the libraries' modules (raising what that raises); builds
        nothing."""
        from hwplug.registry import import_object

        found: dict[int, tuple[NativeLibrary, list[str]]] = {}
        for variant in (v for op in self._ops for v in self.variants(op)):
            if variant.native is None or variant.device_rejection(platform):
                continue
            native = variant.native
            library = import_object(native) if isinstance(native, str) else native
            for part in getattr(library, "parts", None) or (library,):
                found.setdefault(id(part), (part, []))[1].append(variant.key)
        return list(found.values())

    def default_plan(self) -> KernelPlan:
        """The plan that serves calls of the ops outside a model (``hwplug.ops.<op>(...)``:
        the conformance kit, tests, a variant calling another op): made for the platform
        discovery resolved (this is one of the entry points that read it, discovering on
        first use) under the ``HWPLUG_*_KERNELS`` variables, and made again after the
        registry, the platform or those variables change."""
        from hwplug.discovery import current_platform

        platform, policy = current_platform(), KernelPolicy.from_env()
        plan = self._default_plan
        if plan is None or plan.platform is not platform or plan.policy != policy:
            plan = self._default_plan = KernelPlan(self, platform, policy)
        return plan

    def _preferred_order(self, op: str, policy: KernelPolicy) -> list[Variant]:
        preferred = policy.preferred.get(op, ())
        rank = {name: index for index, name in enumerate(preferred)}
        return sorted(self.variants(op), key=lambda v: rank.get(v.name, len(rank)))


def _build_state(variant: Variant) -> tuple[str | None, str | None]:
    """:func:`explain_build` of a loaded variant's native library; a status that raises
    (a plugin's library) is a rejection reason instead."""
    try:
        return explain_build(variant.native)  # type: ignore[arg-type]
    except Exception as exc:
        logger.warning("kernel variant %s: its native library's status failed: %r",
                       variant.key, exc)
        return f"build status unknown: {exc!r}", None


def _import_failure(variant: Variant) -> str | None:
    """Load a lazy variant; return an import failure as a reason instead of raising."""
    try:
        variant.load()
    except Exception as exc:
        logger.warning("kernel variant %s failed to import: %r", variant.key, exc)
        return f"import failed: {exc!r}"
    return None


#: The process-wide kernel registry (passed to ``hwplug_register_kernels``).
kernels = KernelRegistry(registries.DISCOVERY)
registries.attach("hwplug_register_kernels", kernels)
