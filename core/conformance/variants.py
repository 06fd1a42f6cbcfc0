"""Kernel variants against their op's reference over generated inputs.

For each example (see :mod:`hwplug.conformance.inputs`) the variant and the op's pure-torch
reference get identical, independent copies of the inputs; their outputs (and any argument
the op writes in place) must agree within the op's tolerance for the dtypes involved.
Inputs the variant declines (``supports`` returns a reason, or the leading dimension is
outside its ``num_tokens`` range) are counted as declined, not failed. Only the variant's
declared dtypes are drawn, and for the ops over a paged KV cache only the layouts it
declares: each case's ``NHD`` cache is converted into the layout with the layout's
``from_reference`` (and ``params.layout`` set), and the reference, which serves every
layout through the same conversions, is the oracle.

A variant for the platform present runs on its device, in the dtypes its gates (device
features, capability, toolkit, packages) admit here; what they exclude is "not checked
here". A check that matched is ``passed`` only when the results were observed on that
device, else ``simulated`` (:func:`hwplug.conformance.execution.ran_on`). A variant for a platform that is not present (a kernels-only plugin's, or another
platform's) runs on CPU in its stead, like a simulated platform: a kernel that computes on
CPU tensors is checked, and an error saying its device is missing makes it "not checked
here" (see :func:`hwplug.conformance.explore.guarded`); a wrong number is a failure
either way.
"""

from __future__ import annotations

import importlib.metadata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hypothesis import strategies as st

from hwplug import kernels
from hwplug.conformance.compare import compare_outputs, loosest_tolerance
from hwplug.conformance.execution import Observed, observing, ran_on
from hwplug.conformance.explore import Failure, first_failure, guarded, judge
from hwplug.conformance.inputs import GENERATORS, Case, in_layout
from hwplug.conformance.result import Check, CheckResult, Outcome
from hwplug.conformance.target import Placement
from hwplug.errors import ConfigError, UnknownNameError, UnsupportedError
from hwplug.kv_cache_layout import REFERENCE_LAYOUT, KVCacheLayout, registered_layout

if TYPE_CHECKING:
    from hwplug.kernel_registry import Variant
    from hwplug.kernel_registry.dispatch import Op

#: Most tokens a generated input has beyond the lower end of a variant's num_tokens range.
TOKEN_SPAN = 8


@dataclass
class _Tally:
    tested: Counter[str] = field(default_factory=Counter)  # dtype -> examples that matched
    declined: Counter[str] = field(default_factory=Counter)  # reason -> examples

    def summary(self) -> str:
        tested = ", ".join(f"{n} {dtype}" for dtype, n in sorted(self.tested.items()))
        text = f"{sum(self.tested.values())} inputs matched the reference ({tested})"
        if self.declined:
            reason, _ = self.declined.most_common(1)[0]
            text += f"; {sum(self.declined.values())} declined (e.g. {reason})"
        return text


def missing_package(variant: Variant) -> str | None:
    """Why the variant cannot even be imported here: a package it declares is missing."""
    for package, spec in variant.requirements.packages.items():
        try:
            importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return f"package {package} is not installed (the variant needs {spec})"
    return None


def token_range(variant: Variant) -> st.SearchStrategy[int]:
    """Leading dimensions to draw: inside the variant's ``num_tokens`` range when it has one."""
    low, high = variant.num_tokens or (1, None)
    low = max(low, 1)
    top = low + TOKEN_SPAN if high is None else min(high - 1, low + TOKEN_SPAN)
    return st.integers(low, top)


def _declines(variant: Variant, op_dispatch_arg: int, case: Case) -> str | None:
    if variant.num_tokens is not None:
        low, high = variant.num_tokens
        tokens = case.args[op_dispatch_arg].shape[0]
        if tokens < low or (high is not None and tokens >= high):
            return f"num_tokens {tokens} outside [{low}, {high or 'inf'})"
    return variant.supports(*case.args, **case.kwargs) if variant.supports else None


def _gated_dtypes(variant: Variant, dtypes: list[str], placement: Placement,
                  gates: list[str]) -> list[str]:
    """Drop dtypes the present platform's static gates reject; note why in ``gates``."""
    platform = placement.platform
    if platform is None or placement.simulating:
        return dtypes
    kept = []
    for dtype in dtypes:
        reason = variant.static_rejection(platform, platform.device_type, dtype, None)
        if reason is None:
            kept.append(dtype)
        else:
            gates.append(f"{dtype}: {reason}")
    return kept


def tolerances_of(variant: Variant, op: Op) -> dict[str, tuple[float, float]]:
    """The tolerances ``variant`` is held to: the op's wide ``tolerances`` when it declares
    that it rounds its activations (:attr:`Variant.activation_quantization`), else the op's
    tight ``exact_tolerances``."""
    return op.tolerances if variant.activation_quantization else op.exact_tolerances


def precision(variant: Variant, op: Op) -> str:
    """In words: which tolerances the variant's results were held to."""
    if variant.activation_quantization:
        return f"activations {variant.activation_quantization}: the op's tolerances"
    if op.exact_tolerances is not op.tolerances:
        return "exact activations: the op's exact_tolerances"
    return ""


def _case_body(variant: Variant, placement: Placement, tally: _Tally, observed: Observed
               ) -> Callable[[tuple[Case, KVCacheLayout | None]], None]:
    """Check one generated case, in a KV-cache layout for an op over a paged cache, against
    the reference (``variant`` must be loaded); what it returned and wrote is recorded in
    ``observed``."""
    op = kernels.op(variant.op)

    def body(drawn: tuple[Case, KVCacheLayout | None]) -> None:
        case, layout = drawn
        if layout is not None:
            try:
                case = in_layout(case, op, layout)
            except UnsupportedError as exc:
                tally.declined[str(exc)] += 1
                return
        case = case.to(placement.device)
        declined = _declines(variant, op.dispatch_arg, case)
        if declined:
            tally.declined[declined] += 1
            return
        expected_case, actual_case = case.clone(), case.clone()
        expected = expected_case.outputs(op.reference(*expected_case.args,
                                                      **expected_case.kwargs))
        returned = guarded(lambda: variant.impl(*actual_case.args, **actual_case.kwargs), case.label,
                           simulating=bool(placement.simulating))
        actual = actual_case.outputs(returned)
        observed.tensors([value for _, value in actual])
        problem = compare_outputs(actual, expected,
                                  *loosest_tolerance(tolerances_of(variant, op), case.dtypes))
        if problem:
            raise Failure(f"{problem} at {case.label}")
        tally.tested[case.dtypes[0]] += 1

    return body


def _outcome(variant: Variant, placement: Placement, examples: int) -> Outcome:
    op = kernels.op(variant.op)
    generator = GENERATORS.get(op.name)
    if generator is None:
        return "not checked", f"the kit has no input generator for op {op.name}"
    declared = list(variant.requirements.dtypes or op.tolerances)
    dtypes = [d for d in declared if d in op.tolerances]
    gates: list[str] = []
    placement = placement.serving(variant.requirements.platforms, gates)
    dtypes = placement.judgeable(_gated_dtypes(variant, dtypes, placement, gates), gates)
    if not dtypes:
        why = "; ".join(gates) or f"op {op.name} states no tolerance for {', '.join(declared)}"
        return "not checked", f"no dtype to test here: {why}"
    missing = missing_package(variant)
    if missing:
        return "not checked", missing
    try:
        variant.load()
    except Exception as exc:
        return "failed", f"fails to import: {exc!r}"
    if variant.native is not None:
        try:
            variant.native.ensure_built()  # type: ignore[union-attr]
        except Exception as exc:
            return "failed", f"its native library does not build: {exc}"
    try:
        layouts = _layouts(variant, op)
    except UnknownNameError as exc:
        return "failed", f"declares a KV-cache layout that is not registered: {exc}"
    tally = _Tally()
    strategy = st.tuples(
        st.sampled_from(dtypes).flatmap(lambda d: generator(d, token_range(variant))),
        st.sampled_from(layouts))
    with observing() as observed:
        failure = first_failure(strategy, _case_body(variant, placement, tally, observed),
                                examples)
    where = placement.describe()
    judged = judge(failure, where)
    if judged:
        return judged
    if not tally.tested:
        return "not checked", f"declined every generated input: {tally.summary()}"
    gated = f"; not checked here: {'; '.join(gates)}" if gates else ""
    drawn = ("" if layouts == [None] else
             f" in layout {', '.join(layout.name for layout in layouts)}")
    status, simulation = ran_on(placement, observed, getattr(variant.impl, "__module__", ""))
    held = f" ({precision(variant, op)})" if precision(variant, op) else ""
    return status, f"{tally.summary()}{drawn}{held} {where}{gated}", simulation


def _layouts(variant: Variant, op: Op) -> list[KVCacheLayout | None]:
    """The layouts to draw the variant's cases in: those it declares for an op over a paged
    KV cache (the reference ``NHD`` when none), else None (no layout)."""
    if op.layout_arg is None:
        return [None]
    return [registered_layout(name) for name in variant.layouts or (REFERENCE_LAYOUT,)]


def variant_check(variant: Variant, placement: Placement, examples: int) -> Check:
    """The check of one variant, to run later."""
    return Check(f"kernel {variant.key}", lambda: _outcome(variant, placement, examples))


def check_variant(variant: Variant | str, placement: Placement | None = None,
                  examples: int = 20) -> CheckResult:
    """Check one kernel variant (a :class:`Variant` or its ``"op/name"`` key) now.

    Runs on CPU unless ``placement`` says otherwise; the reference variant itself is the
    oracle and cannot be checked against itself (ValueError).
    """
    if isinstance(variant, str):
        variant = kernels.get(variant)
    if variant.name == kernels.REFERENCE:
        raise ConfigError(f"{variant.key} is the oracle; check the other variants against it")
    return variant_check(variant, placement or Placement(), examples).run()
