"""Copying checkpoint tensors into a model's parameters by Hugging Face name."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

import torch
from torch import nn

from hwplug.errors import ModelError
from hwplug.model_zoo.layers.linear import copy_checked

logger = logging.getLogger(__name__)

#: ``(parameter name in the model, shard of a fused layer or None)``.
Target = tuple[str, str | None]
#: Maps a checkpoint name to its target, or to None for a tensor the model skips on purpose.
Rename = Callable[[str], Target | None]


#: Parameters that hold scales -> whether they must also be > 0 (activations are divided
#: by them): checked at load, as one NaN or inf there turns every output NaN.
SCALE_PARAMETERS = {"weight_scale": False, "weight_scale_inv": False, "input_scale": True,
                    "k_scale": True, "v_scale": True,
                    **{f"{stack}_proj{suffix}": False for stack in ("gate_up", "down")
                       for suffix in ("_scale", "_scale_inv")}}


def check_scales(hf_name: str, param_name: str, tensor: torch.Tensor) -> None:
    """Raise :class:`ModelError` naming checkpoint tensor ``hf_name`` when it loads into a
    scale parameter (:data:`SCALE_PARAMETERS`) and holds a value that is not finite (or,
    where the scale divides, not above 0)."""
    positive = SCALE_PARAMETERS.get(param_name.rpartition(".")[2])
    if positive is None:
        return
    values = tensor.detach().float().reshape(-1)
    bad = ~torch.isfinite(values)
    if positive:
        bad |= values <= 0
    if bool(bad.any()):
        example = float(values[bad][0])
        raise ModelError(f"checkpoint tensor {hf_name}: scales must be finite"
                         f"{' and > 0' if positive else ''}; {int(bad.sum())} of "
                         f"{values.numel()} are not (e.g. {example})")


def fused_target(name: str, fused: Mapping[str, Target]) -> Target:
    """Route ``a.b.q_proj.weight`` to ``("a.b.qkv_proj.weight", "q")`` when ``fused`` maps
    the owning module's name ``q_proj`` to ``("qkv_proj", "q")``; other names map to
    ``(name, None)``."""
    module_path, _, param = name.rpartition(".")
    parent, _, module = module_path.rpartition(".")
    if module not in fused:
        return name, None
    fused_module, shard = fused[module]
    return f"{parent}.{fused_module}.{param}" if parent else f"{fused_module}.{param}", shard


def load_named_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                       rename: Rename) -> None:
    """Load every ``(checkpoint name, tensor)`` of ``weights`` into ``model``.

    ``rename`` gives each name's target parameter and shard. Parameters of a module with
    ``shard_names`` (a :class:`~.linear.FusedLinear`) are expected once per shard; any
    other parameter is expected once. A module with a ``load_weight(param_name, tensor,
    shard)`` method loads its parameters itself; others are copied whole. Parameters a
    module lists in ``optional_parameters`` may be absent (they keep their value). Tensors
    are cast to the parameter's dtype and device, within one kind (:func:`check_dtype_kind`).
    Raises :class:`ModelError` naming every unexpected checkpoint name and every parameter
    (or shard) the checkpoint did not provide, or the tensor whose shape or dtype kind does
    not fit.
    """
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())  # one walk, not one per tensor

    def owner(param_name: str) -> nn.Module:
        return modules[param_name.rpartition(".")[0]]

    expected = {(name, shard) for name in params
                for shard in getattr(owner(name), "shard_names", (None,))}
    unexpected, loaded = [], set()
    for hf_name, tensor in weights:
        target = rename(hf_name)
        if target is None:
            logger.debug("skipping checkpoint tensor %s", hf_name)
            continue
        name, shard = target
        if (name, shard) not in expected:
            unexpected.append(hf_name)
            continue
        check_dtype_kind(hf_name, tensor, name, params[name])
        check_scales(hf_name, name, tensor)
        try:
            loader = getattr(owner(name), "load_weight", None)
            if loader is None:
                copy_checked(params[name], tensor, name)
            else:
                loader(name.rpartition(".")[2], tensor, shard)
        except ModelError as exc:
            raise ModelError(f"checkpoint tensor {hf_name}: {exc}") from None
        loaded.add((name, shard))
    missing = sorted(f"{n}[{s}]" if s else n for n, s in expected - loaded
                     if n.rpartition(".")[2] not in getattr(owner(n), "optional_parameters",
                                                            ()))
    if unexpected or missing:
        raise ModelError(f"checkpoint does not match {type(model).__name__}: "
                         f"unexpected tensors {sorted(unexpected) or 'none'}; "
                         f"missing parameters {missing or 'none'}")


def dtype_kind(dtype: torch.dtype) -> str:
    """``"float"`` (16 bits and wider), ``"fp8"`` (8 bits and narrower, e.g. float8_e4m3fn),
    ``"int"`` (signed or unsigned), ``"bool"`` or ``"complex"``."""
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "fp8" if dtype.itemsize == 1 else "float"
    return "bool" if dtype == torch.bool else "int"


def check_dtype_kind(hf_name: str, tensor: torch.Tensor, param_name: str,
                     param: torch.Tensor) -> None:
    """Raise :class:`ModelError` unless checkpoint ``tensor`` is of the same
    :func:`dtype_kind` as ``param``.

    A cast within a kind (bfloat16 into float32, int8 into int32) is a load; across kinds it
    reinterprets the checkpoint (integer bytes as float weights, a float weight into an fp8
    parameter without its scale), so it is refused. Quant methods create integer or fp8
    parameters for the integer or fp8 tensors their checkpoints store.
    """
    have, want = dtype_kind(tensor.dtype), dtype_kind(param.dtype)
    if have != want:
        stored, held = (str(t.dtype).removeprefix("torch.") for t in (tensor, param))
        raise ModelError(f"checkpoint tensor {hf_name} is {stored} ({have}), but parameter "
                         f"{param_name} holds {held} ({want}): a {have} tensor is not loaded "
                         f"into a {want} parameter")
