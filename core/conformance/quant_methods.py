"""Quant methods against their own dequantised weight: ``apply`` vs ``x @ W.T + bias``.

The kit builds a method with ``from_config({"quant_method": name})`` and, per drawn layer
shape and dtype, creates the layer's weights and fills every parameter in its own dtype
(:func:`fill`: float values, random integers over the whole integer range, random finite
fp8 values, and positive values, at most :data:`SCALE_MAX` when float, for parameters
named ``*scale*``; a method whose parameters hold a format random values are not, e.g.
GGUF blocks, gives its own random tensors through ``example_checkpoint``), then runs
``process_weights_after_loading``. The oracle is the method's
:meth:`~hwplug.QuantMethod.dequantize`: ``apply(layer, x)`` must match
``x @ dequantize(layer).T + bias``. Where activations are quantized, by the method
(:meth:`~hwplug.QuantMethod.activation_quantization`) or by a kernel variant that served
its GEMM (:func:`served_rounding`), within the tolerance of the method's GEMM op
(``gemm_op``) for the activation dtype plus the most that rounding to that format can
change each output (:func:`rounding_bound`); where none is, within the op's tight
``exact_tolerances`` (so a 0.5% error in a scale fails). A layer shape the method refuses
(a :class:`~hwplug.errors.ConfigError` or :class:`~hwplug.errors.UnsupportedError`, e.g.
sizes that are not a multiple of its block) is counted as declined, not failed. A method
without ``dequantize``, one whose ``min_capability`` the present device lacks, and one
that needs absent hardware are "not checked here".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from hwplug import kernels
from hwplug.conformance.compare import loosest_tolerance, mismatch
from hwplug.conformance.execution import Observed, observing, ran_on
from hwplug.conformance.explore import Failure, first_failure, guarded, judge
from hwplug.conformance.result import Check, CheckResult, Outcome
from hwplug.conformance.target import Placement
from hwplug.dtypes import torch_dtype
from hwplug.errors import ConfigError, UnsupportedError
from hwplug.quantization import QuantMethod, ScaleDescriptor

#: Scale parameters are filled from [SCALE_MIN, SCALE_MAX].
SCALE_MIN, SCALE_MAX = 0.5, 1.5
#: Layer sizes drawn: small ones, and multiples of 128 for block-scaled methods.
IN_FEATURES = (16, 64, 128, 256)
OUT_FEATURES = (16, 48, 128, 256)


class _NoOracle(Exception):
    """The method does not implement ``dequantize``."""


class _Declined(Exception):
    """The method refused the drawn layer shape (its message says why)."""


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


def fill(layer: torch.nn.Module, rng: torch.Generator, skip: Collection[str] = ()) -> None:
    """Randomise every parameter of ``layer`` but those named in ``skip`` in its own dtype
    (see the module docstring)."""
    with torch.no_grad():
        for name, param in layer.named_parameters():
            if name in skip:
                continue
            dtype, shape = param.dtype, param.shape
            if "scale" in name and not dtype.is_floating_point:  # e.g. integer shifts
                values = torch.randint(1, 9, shape, generator=rng)
            elif "scale" in name:
                values = torch.rand(shape, generator=rng) * (SCALE_MAX - SCALE_MIN) + SCALE_MIN
            elif dtype.is_floating_point and dtype.itemsize == 1:  # fp8: finite values
                top = torch.finfo(dtype).max
                values = (torch.randn(shape, generator=rng) * 2).clamp(-top, top)
            elif dtype.is_floating_point:
                values = torch.randn(shape, generator=rng) * 0.5
            elif dtype == torch.bool:
                values = torch.randint(0, 2, shape, generator=rng)
            else:  # integers over the dtype's whole range (int64 over int32's)
                info = torch.iinfo(dtype if dtype.itemsize <= 4 else torch.int32)
                values = torch.randint(info.min, info.max + 1, shape, generator=rng,
                                       dtype=torch.int64)
            param.copy_(values.to(dtype))


def load_example(layer: torch.nn.Module, tensors: dict[str, torch.Tensor], rows: int) -> None:
    """Load a method's :meth:`~hwplug.QuantMethod.example_checkpoint` into ``layer``: each
    tensor through its parameter's ``weight_loader`` (all ``rows`` output rows), or copied."""
    with torch.no_grad():
        for name, tensor in tensors.items():
            param = getattr(layer, name)
            loader = getattr(param, "weight_loader", None)
            if loader is not None:
                loader(param, tensor, (0, rows))
            else:
                param.copy_(tensor)


def rounding_bound(x: torch.Tensor, descriptor: ScaleDescriptor,
                   weight: torch.Tensor) -> torch.Tensor:
    """``[M, N]``: the most rounding ``x [M, K]`` to ``descriptor`` (its dtype, scaled per
    its granularity) can change ``x @ weight.T``: ``|dx| @ |weight|.T`` with ``|dx|`` the
    format's largest rounding error per element. Dynamic scales are ``amax / largest``
    over each scaled block; a static scale is at most :data:`SCALE_MAX`, as the kit filled
    it."""
    dtype = torch_dtype(descriptor.dtype)
    x = x.float().abs()
    floating = dtype.is_floating_point
    top = torch.finfo(dtype).max if floating else torch.iinfo(dtype).max
    scale = (torch.full_like(x, SCALE_MAX) if not descriptor.dynamic
             else _block_amax(x, descriptor) / top)
    if floating:
        info = torch.finfo(dtype)
        error = x * info.eps / 2 + scale * info.smallest_normal * info.eps / 2
    else:
        error = scale / 2
    return error @ weight.abs().T


def _block_amax(x: torch.Tensor, descriptor: ScaleDescriptor) -> torch.Tensor:
    """``|x|``'s maximum over each block the descriptor scales together, per element."""
    rows, width = x.shape
    if descriptor.granularity == "token":
        return x.amax(dim=-1, keepdim=True).expand_as(x)
    group = (descriptor.group_shape or (width,))[-1]
    if descriptor.granularity in ("group", "block") and width % group == 0:
        blocks = x.view(rows, width // group, group).amax(dim=-1)
        return blocks.repeat_interleave(group, dim=-1)
    return x.amax().expand_as(x)  # per tensor (or a group that does not divide: looser)


def _checked(call: Callable[[], object], case: _Linear, placement: Placement) -> object:
    """``call()``, a refused shape raised as :class:`_Declined`."""
    try:
        return guarded(call, case.label(), simulating=bool(placement.simulating))
    except Failure as failure:
        if isinstance(failure.__cause__, (ConfigError, UnsupportedError)):
            raise _Declined(str(failure.__cause__)) from None
        raise


def served_rounding(layer: torch.nn.Module, op: str) -> ScaleDescriptor | None:
    """How the kernel variants that served ``layer``'s GEMM (its bound ``gemm_kernel``,
    as hwplug's methods bind it) round activations: the first one's declared
    :attr:`~hwplug.kernel_registry.Variant.activation_quantization`, or None when every
    one computes with the activations as given."""
    bound = getattr(layer, "gemm_kernel", None)
    served = sorted(bound.used()) if hasattr(bound, "used") else []
    declared = [kernels.get(f"{op}/{name}").activation_quantization for name in served]
    return next((d for d in declared if d is not None), None)


def _body(method: QuantMethod, placement: Placement, done: Counter[str],
          refused: Counter[str], observed: Observed) -> Callable[[_Linear], None]:
    """Check one drawn layer; count it in ``done`` by dtype, or in ``refused`` by reason;
    record its output in ``observed``."""
    op = kernels.op(method.gemm_op)

    def body(case: _Linear) -> None:
        rng = torch.Generator().manual_seed(case.seed)
        dtype = torch_dtype(case.dtype)
        layer = torch.nn.Module()
        x = torch.randn((case.tokens, case.in_features), generator=rng).to(dtype)
        try:
            _checked(lambda: method.create_weights(layer, case.in_features,
                                                   case.out_features, dtype, case.bias),
                     case, placement)
            example = _checked(lambda: method.example_checkpoint(
                case.in_features, case.out_features, rng), case, placement)
            fill(layer, rng, skip=example or {})
            if example:
                load_example(layer, example, case.out_features)
            layer.to(placement.device)
            _checked(lambda: method.process_weights_after_loading(layer), case, placement)
            out = _checked(lambda: method.apply(layer, x.to(placement.device)), case, placement)
            observed.tensors(out)
        except _Declined as declined:
            refused[str(declined)] += 1
            return
        try:
            weight = method.dequantize(layer).detach().float().cpu()
        except UnsupportedError as exc:
            raise _NoOracle(str(exc)) from None
        if weight.shape != (case.out_features, case.in_features):
            raise Failure(f"dequantize returned shape {tuple(weight.shape)}, expected "
                          f"{(case.out_features, case.in_features)} at {case.label()}")
        bias = layer.bias.detach().float().cpu() if getattr(layer, "bias", None) is not None \
            else 0.0
        expected = x.float() @ weight.T + bias
        descriptor = method.activation_quantization() or served_rounding(layer, op.name)
        slack = rounding_bound(x, descriptor, weight) if descriptor else None
        tolerances = op.tolerances if descriptor else op.exact_tolerances
        problem = mismatch(out, expected.to(dtype), *loosest_tolerance(tolerances,
                                                                       (case.dtype,)),
                           slack=slack)
        if problem:
            raise Failure(f"{problem} at {case.label()}")
        done[case.dtype] += 1

    return body


def _device_gap(cls: type[QuantMethod], placement: Placement) -> str | None:
    """Why the present device cannot run the method (its requirements, the platform's
    judgement: :meth:`~hwplug.Platform.quant_method_reasons`), or None."""
    platform = placement.platform
    if platform is None:
        return None
    reasons = platform.quant_method_reasons(cls.get_name())
    return f"{'; '.join(reasons)} ({platform.name} here)" if reasons else None


def _outcome(cls: type[QuantMethod], placement: Placement, count: int) -> Outcome:
    notes: list[str] = []
    tolerances = kernels.op(cls.gemm_op).tolerances
    dtypes = placement.judgeable([d for d in cls.supported_dtypes if d in tolerances], notes)
    if not dtypes:
        return "not checked", "; ".join(
            ["declares no activation dtype the kit can judge here", *notes])
    gap = _device_gap(cls, placement)
    if gap:
        return "not checked", gap
    method = cls.from_config({"quant_method": cls.get_name()})
    strategy = st.builds(_Linear, st.sampled_from(dtypes), st.integers(1, 8),
                         st.sampled_from(IN_FEATURES), st.sampled_from(OUT_FEATURES),
                         st.booleans(), st.integers(0, 2**31 - 1))
    done: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    with observing() as observed:
        failure = first_failure(strategy, _body(method, placement, done, refused, observed),
                                count)
    if isinstance(failure, _NoOracle):
        return "not checked", f"no oracle: {failure}"
    where = placement.describe()
    judged = judge(failure, where)
    if judged:
        return judged
    example = f" (e.g. {refused.most_common(1)[0][0]})" if refused else ""
    if not done:
        return "not checked", f"refused every drawn layer shape{example}"
    untested = f"; not checked here: {'; '.join(notes)}" if notes else ""
    declined = f"; {sum(refused.values())} layer shapes refused{example}" if refused else ""
    detail = ", ".join(f"{n} {d}" for d, n in sorted(done.items()))
    status, simulation = ran_on(placement, observed, cls.__module__)
    return status, (f"{sum(done.values())} layers ({detail}) matched x @ dequantize(W).T"
                    f" + bias {where} ({method.describe()}){declined}{untested}"), simulation


def quant_method_check(name: str, load: Callable[[], type[QuantMethod]], placement: Placement,
                       count: int) -> Check:
    """The check of quant method ``name`` (``load`` imports its class when the check runs)."""
    return Check(f"quant method {name}", lambda: _outcome(load(), placement, count))


def check_quant_method(cls: type[QuantMethod], placement: Placement | None = None,
                       examples: int = 10) -> CheckResult:
    """Check quant method class ``cls`` now, on CPU unless ``placement`` says otherwise."""
    return quant_method_check(cls.get_name(), lambda: cls, placement or Placement(),
                              examples).run()
