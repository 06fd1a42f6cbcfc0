"""Quant methods against a dequantised reference.

The kit builds a method with ``from_config({"quant_method": name})``, creates a layer's
weights, fills every floating parameter with random values (parameters whose name
contains ``scale`` with positive ones), and takes the dequantised weight to be
``weight * weight_scale`` (``weight_scale`` a scalar, ``[out]`` or ``[out, 1]``; absent
means 1). After ``process_weights_after_loading``, ``apply(layer, x)`` must match
``x @ W.T + bias`` within the ``scaled_mm`` tolerance of the activation and weight dtypes.
Methods that pack weights as integers need a dequantiser the kit does not have; they are
skipped with that reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from hwplug import ops
from hwplug.conformance.compare import loosest_tolerance, mismatch
from hwplug.conformance.explore import Failure, first_failure, guarded, judge
from hwplug.conformance.result import Check, Status
from hwplug.conformance.target import Placement
from hwplug.dtypes import dtype_name, torch_dtype
from hwplug.quantization import QuantMethod


class _PackedWeights(Exception):
    """The layer holds integer parameters: no generic dequantised reference exists."""


@dataclass(frozen=True)
class _Linear:
    dtype: str
    tokens: int
    in_features: int
    out_features: int
    bias: bool
    seed: int

    def label(self) -> str:
        return (f"x ({self.tokens}, {self.in_features}) {self.dtype} -> {self.out_features}"
                f"{' with bias' if self.bias else ''}")


def _fill(layer: torch.nn.Module, rng: torch.Generator) -> torch.Tensor:
    """Randomise the layer's parameters; return the dequantised ``[out, in]`` fp32 weight."""
    with torch.no_grad():
        for name, param in layer.named_parameters():
            if not param.dtype.is_floating_point:
                raise _PackedWeights(f"parameter {name} is {param.dtype}")
            values = (torch.rand(param.shape, generator=rng) + 0.5 if "scale" in name
                      else torch.randn(param.shape, generator=rng) * 0.5)
            param.copy_(values.to(param.dtype))
    weight = layer.weight.float()
    scale = getattr(layer, "weight_scale", None)
    if scale is None:
        return weight
    scale = scale.float()
    return weight * (scale[:, None] if scale.dim() == 1 and scale.numel() > 1 else scale)


def _body(method: QuantMethod, placement: Placement, done: list[int]
          ) -> Callable[[_Linear], None]:
    def body(case: _Linear) -> None:
        rng = torch.Generator().manual_seed(case.seed)
        dtype = torch_dtype(case.dtype)
        layer = torch.nn.Module()
        method.create_weights(layer, case.in_features, case.out_features, dtype, case.bias)
        weight = _fill(layer, rng)
        weight_dtype = dtype_name(layer.weight.dtype)
        bias = layer.bias.float() if case.bias else 0.0
        x = torch.randn((case.tokens, case.in_features), generator=rng).to(dtype)
        expected = (x.float() @ weight.T + bias).to(dtype).to(placement.device)
        layer.to(placement.device)

        def apply() -> torch.Tensor:
            method.process_weights_after_loading(layer)
            return method.apply(layer, x.to(placement.device))

        out = guarded(apply, case.label(), simulating=bool(placement.simulating))
        tolerance = loosest_tolerance(ops.scaled_mm.tolerances, (case.dtype, weight_dtype))
        problem = mismatch(out, expected, *tolerance)
        if problem:
            raise Failure(f"{problem} at {case.label()}")
        done.append(1)

    return body


def _outcome(cls: type[QuantMethod], placement: Placement, count: int) -> tuple[Status, str]:
    notes: list[str] = []
    dtypes = placement.judgeable([d for d in cls.supported_dtypes
                                  if d in ops.scaled_mm.tolerances], notes)
    if not dtypes:
        return "skipped", "; ".join(["declares no activation dtype the kit can judge", *notes])
    method = cls.from_config({"quant_method": cls.get_name()})
    strategy = st.builds(_Linear, st.sampled_from(dtypes), st.integers(1, 8),
                         st.sampled_from((16, 64)), st.sampled_from((16, 48)), st.booleans(),
                         st.integers(0, 2**31 - 1))
    done: list[int] = []
    failure = first_failure(strategy, _body(method, placement, done), count)
    if isinstance(failure, _PackedWeights):
        return "skipped", f"no generic dequantised reference: {failure}"
    where = placement.describe()
    untested = f"; not tested: {'; '.join(notes)}" if notes else ""
    return judge(failure, where) or (
        "passed", f"{len(done)} layers matched x @ dequantised(W).T + bias {where}{untested}")


def quant_method_check(name: str, load: Callable[[], type[QuantMethod]], placement: Placement,
                       count: int) -> Check:
    """The check of quant method ``name`` (``load`` imports its class when the check runs)."""
    return Check(f"quant method {name}", lambda: _outcome(load(), placement, count))
