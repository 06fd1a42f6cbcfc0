"""``Op``: one declared op (contract, reference, tolerances), callable outside a model.

Inside a model, layers call the ops their :class:`~hwplug.kernel_registry.plan.KernelPlan`
bound when the model was built. Called directly (``hwplug.ops.rms_norm(...)``: the
conformance kit, tests, a variant that calls another op), an op binds itself in the
registry's default plan for the call's device, dtype and, for the ops over a paged KV
cache (:class:`LayoutOp`), layout, once per such key; a steady-state call costs one dict
lookup, then the bound op's own. Any registry change empties those keys.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hwplug.dtypes import dtype_name
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.legacy_calls import current_form

if TYPE_CHECKING:
    from hwplug.kernel_registry.registry import KernelRegistry

#: Name of every op's pure-torch reference variant (the conformance oracle).
REFERENCE = "reference"


def dtype_text(dtype: Any) -> str:
    """hwplug's name of a torch dtype (``"float32"``), or torch's for one hwplug lacks."""
    try:
        return dtype_name(dtype)
    except UnsupportedError:
        return str(dtype).removeprefix("torch.")


class Op:
    """One declared op. Call it like its reference; ``__doc__`` is its contract."""

    #: Position of the :class:`~hwplug.attention.PagedAttentionParams` argument of an op
    #: over a paged KV cache (see :class:`LayoutOp`); None for the others.
    layout_arg: int | None = None

    def __init__(self, registry: KernelRegistry, name: str, doc: str,
                 tolerances: dict[str, tuple[float, float]], dispatch_arg: int) -> None:
        self.registry, self.name, self.__doc__ = registry, name, doc
        self.tolerances, self.dispatch_arg = tolerances, dispatch_arg
        #: ``(atol, rtol)`` per dtype for a variant that computes with the activations as
        #: given (:attr:`~hwplug.kernel_registry.Variant.activation_quantization` None);
        #: :attr:`tolerances` allow what a variant that quantizes them may do. The same
        #: unless :meth:`~hwplug.kernel_registry.KernelRegistry.define_op` was told.
        self.exact_tolerances = tolerances
        self._bound: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self._edges: list[int] | None = None
        #: The variants that served calls of this op, in any plan, since the last change.
        self.used: set[str] = set()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        x = args[self.dispatch_arg]
        key = (x.device.type, x.dtype, self._layout(args, kwargs))
        try:
            bound = self._bound[key]
        except KeyError:
            bound = self._bound[key] = self.registry.default_plan().bind(
                self.name, dtype_text(x.dtype), key[2], key[0])
        return bound(*args, **kwargs)

    def _layout(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """The KV-cache layout of a call (None: the op has none)."""
        return None

    def reference(self, *args: Any, **kwargs: Any) -> Any:
        """Call the pure-torch reference directly (the numerical oracle)."""
        variant = self.registry.get(f"{self.name}/{REFERENCE}")
        variant.load()
        return variant.impl(*args, **kwargs)  # type: ignore[operator]

    def variants_used(self) -> set[str]:
        """Names of the variants that served this op's calls since the last change."""
        return set(self.used)

    def token_edges(self) -> list[int]:
        """Where the op's token buckets meet: every bound of its variants' ``num_tokens``
        ranges, sorted (empty: one bucket); computed on first use after a change."""
        if self._edges is None:
            edges = set()
            for variant in self.registry.variants(self.name):
                if variant.num_tokens is not None:
                    low, high = variant.num_tokens
                    edges.update(e for e in (low, high) if e is not None)
            self._edges = sorted(edges)
        return self._edges

    def invalidate(self) -> None:
        """Forget bound keys, token edges and what served calls (the registry calls this on
        every change; it reads nothing, so registering never runs the registry's filler)."""
        self._bound.clear()
        self.used.clear()
        self._edges = None


class LayoutOp(Op):
    """An op over a paged KV cache (``reshape_and_cache``, ``paged_attention``): the layout
    of its :class:`~hwplug.attention.PagedAttentionParams` argument (positional argument
    ``layout_arg``, or keyword ``params``) joins the dispatch key, so a variant serves
    only the layouts it declares (see :attr:`~hwplug.kernel_registry.Variant.layouts`). A
    call in release 0.1's form, the arguments written out, is converted with a deprecation
    warning (:mod:`~hwplug.kernel_registry.legacy_calls`)."""

    def __init__(self, registry: KernelRegistry, name: str, doc: str,
                 tolerances: dict[str, tuple[float, float]], dispatch_arg: int,
                 layout_arg: int) -> None:
        super().__init__(registry, name, doc, tolerances, dispatch_arg)
        self.layout_arg = layout_arg

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = current_form(self.name, args, kwargs)
        return super().__call__(*args, **kwargs)

    def reference(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = current_form(self.name, args, kwargs)
        return super().reference(*args, **kwargs)

    def _layout(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        params = args[self.layout_arg] if len(args) > self.layout_arg else kwargs["params"]
        return params.layout.name
