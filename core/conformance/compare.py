"""Comparing a result with the reference's, within an op's stated tolerance.

``actual`` matches ``expected`` when shapes and dtypes are equal and every element obeys
``|actual - expected| <= atol + rtol * |expected|`` (NaN matches only NaN). A mismatch is
described in words: the largest error, how many elements are off, and the worst one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch


def loosest_tolerance(tolerances: Mapping[str, tuple[float, float]],
                      dtypes: Iterable[str]) -> tuple[float, float]:
    """The largest ``(atol, rtol)`` over ``dtypes`` that have a stated tolerance.

    Raises ``KeyError`` naming the dtypes when none of them has one.
    """
    stated = [tolerances[d] for d in dtypes if d in tolerances]
    if not stated:
        raise KeyError(f"no tolerance stated for {', '.join(dtypes)}; stated for "
                       f"{', '.join(tolerances)}")
    return max(t[0] for t in stated), max(t[1] for t in stated)


def mismatch(actual: Any, expected: torch.Tensor, atol: float, rtol: float,
             slack: torch.Tensor | None = None) -> str | None:
    """None when ``actual`` matches ``expected`` within tolerance, else what differs.

    ``slack`` (broadcast to ``expected``'s shape) adds a known per-element error bound
    (e.g. from rounding an input to a quantized format) to ``atol``."""
    if not isinstance(actual, torch.Tensor):
        return f"returned {type(actual).__name__}, expected a tensor"
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype}, expected {expected.dtype}"
    got, want = actual.detach().cpu().float(), expected.detach().cpu().float()
    extra = 0.0 if slack is None else slack.detach().cpu().float()
    close = ((got == want) | ((got - want).abs() <= atol + extra + rtol * want.abs())
             | (got.isnan() & want.isnan()))
    if bool(close.all()):
        return None
    error = (got - want).abs().nan_to_num(nan=float("inf"))
    error = torch.where(close, torch.zeros_like(error), error)
    worst = tuple(int(i) for i in torch.unravel_index(error.argmax(), error.shape))
    bad = int((~close).sum())
    allowed = f"atol {atol:g}" + (" + rounding bound" if slack is not None else "")
    return (f"max abs error {float(error.max()):.3g} > {allowed} + rtol {rtol:g}*|ref| "
            f"({bad} of {close.numel()} elements; worst at {worst}: got {float(got[worst]):.5g},"
            f" expected {float(want[worst]):.5g})")


def compare_outputs(actual: Sequence[tuple[str, Any]], expected: Sequence[tuple[str, Any]],
                    atol: float, rtol: float) -> str | None:
    """Compare named outputs pairwise; an expected ``None`` accepts anything."""
    if len(actual) != len(expected):
        return f"returned {len(actual)} outputs, the reference {len(expected)}"
    for (name, got), (_, want) in zip(actual, expected, strict=True):
        if want is None:
            continue
        problem = mismatch(got, want, atol, rtol)
        if problem:
            return f"{name}: {problem}"
    return None
