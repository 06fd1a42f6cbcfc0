"""Reading a checkpoint's ``quantization_config`` into a quant method name and its scheme.

Understood formats (as transformers, vLLM and llm-compressor write them):

- ``{"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme":
  "dynamic"}``: fine-grained fp8 (DeepSeek-V3 style): e4m3 weights with one
  ``weight_scale_inv`` per 128x128 block, activations quantized per token group of 128.
  Without ``weight_block_size``: one ``weight_scale`` per tensor, activations per tensor,
  dynamic or ``"static"`` (an ``input_scale`` per layer).
- ``{"quant_method": "compressed-tensors", "config_groups": {...}}``: one group targeting
  ``Linear`` with 8-bit symmetric ``weights`` (``type`` float -> fp8, int -> int8; strategy
  tensor, channel, block or group) and ``input_activations`` (tensor, token or group;
  dynamic or static) or none (weight-only). Scales are ``weight_scale`` / ``input_scale``.
  4-bit int weights (``format: pack-quantized``, W4A16) are the int4 method's
  (:mod:`.int4`). Columns reordered at run time (``actorder: group``, a ``weight_g_idx``
  per layer) are refused; ``actorder: weight`` only changed the order of quantization.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hwplug import checks
from hwplug.errors import ConfigError, UnsupportedError
from hwplug.quantization import ScaleDescriptor

#: Modules a checkpoint may leave unquantized that hwplug never quantizes anyway: the LM
#: head and the routers of mixture-of-experts layers (llm-compressor's MoE recipes ignore
#: ``re:.*mlp.gate$``).
UNQUANTIZED_ANYWAY = ("lm_head", "re:.*lm_head", "re:.*mlp.gate$")
_TYPES = {("float", 8): "fp8_e4m3", ("int", 8): "int8", ("int", 4): "int4"}
_METHODS = {"fp8_e4m3": "fp8", "int8": "int8", "int4": "int4"}
#: ``actorder`` values whose checkpoints store their columns in order (no ``g_idx``).
ORDERED_ACTORDERS = (None, False, "weight")


@dataclass(frozen=True)
class LinearScheme:
    """What a quantized linear layer stores and how it computes: the weight's scales, and
    the activation's (None: weight-only, activations stay in the model dtype). Scales are
    stored under ``weight_scale_name`` (``weight_scale``, or ``weight_scale_inv``)."""

    weight: ScaleDescriptor
    activation: ScaleDescriptor | None
    weight_scale_name: str = "weight_scale"


def method_name(quant_config: dict[str, Any] | None) -> str:
    """The registered quant method that runs a checkpoint with this config."""
    if not quant_config:
        return "unquantized"
    name = str(quant_config.get("quant_method", "unquantized"))
    if name == "compressed-tensors":
        return _METHODS[compressed_tensors_scheme(quant_config).weight.dtype]
    return name


def fp8_scheme(config: dict[str, Any]) -> LinearScheme:
    """The scheme of a ``quant_method: fp8`` config."""
    block = config.get("weight_block_size")
    dynamic = config.get("activation_scheme", "dynamic") == "dynamic"
    if block is not None and (not isinstance(block, (list, tuple))
                              or not all(checks.is_integer(b) and b >= 1 for b in block)):
        raise ConfigError(f"quantization_config weight_block_size must be a list of "
                          f"positive integers (e.g. [128, 128]), got {checks.describe(block)}")
    if block:
        if len(block) != 2 or not dynamic:
            raise UnsupportedError(f"fp8 weight_block_size {block!r} needs two sizes and "
                                   "dynamic activations")
        return LinearScheme(ScaleDescriptor("fp8_e4m3", "block", group_shape=tuple(block)),
                            ScaleDescriptor("fp8_e4m3", "group", dynamic=True,
                                            group_shape=(1, int(block[1]))),
                            "weight_scale_inv")
    return LinearScheme(ScaleDescriptor("fp8_e4m3", "tensor"),
                        ScaleDescriptor("fp8_e4m3", "tensor", dynamic=dynamic))


def compressed_tensors_scheme(config: dict[str, Any]) -> LinearScheme:
    """The scheme of a ``quant_method: compressed-tensors`` config (one Linear group)."""
    ignored = [m for m in config.get("ignore") or () if m not in UNQUANTIZED_ANYWAY]
    if ignored:
        raise UnsupportedError(f"compressed-tensors checkpoints that leave {ignored} "
                               "unquantized are not supported (only lm_head may be ignored)")
    groups = list(config_groups(config).values())
    if len(groups) != 1 or "Linear" not in groups[0].get("targets", ()):
        raise UnsupportedError("compressed-tensors: expected one config group targeting "
                               f"Linear, got {len(groups)}")
    weights = _descriptor(groups[0].get("weights"), "weights")
    activations = groups[0].get("input_activations")
    activation = _descriptor(activations, "input_activations") if activations else None
    return LinearScheme(weights, activation)


def config_groups(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A compressed-tensors config's ``config_groups`` (group name -> group mapping; none:
    empty); another type is a :class:`ConfigError` naming it."""
    groups = checks.mapping(none="no groups")("quantization_config config_groups",
                                              config.get("config_groups")) or {}
    for name, group in groups.items():
        checks.mapping()(f"quantization_config config_groups[{name!r}]", group)
    return groups


def _descriptor(spec: dict[str, Any] | None, what: str) -> ScaleDescriptor:
    if not spec:
        raise UnsupportedError(f"compressed-tensors: the group has no {what}")
    kind = _TYPES.get((spec.get("type"), spec.get("num_bits")))
    if kind is None:
        raise UnsupportedError(f"compressed-tensors {what}: {spec.get('num_bits')}-bit "
                               f"{spec.get('type')} is not supported; supported: 8-bit float "
                               "(fp8), 8-bit int and 4-bit int (weights)")
    if not spec.get("symmetric", True):
        raise UnsupportedError(f"compressed-tensors {what}: asymmetric (zero-point) "
                               "quantization is not supported")
    if spec.get("actorder") not in ORDERED_ACTORDERS:
        raise UnsupportedError(f"compressed-tensors {what}: actorder {spec.get('actorder')!r} "
                               "(columns permuted by weight_g_idx) is not supported; "
                               "supported: null, 'weight'")
    strategy = spec.get("strategy", "tensor")
    shape = None
    if strategy == "block":
        shape = tuple(spec.get("block_structure") or ())
    elif strategy == "group":
        shape = (1, int(spec.get("group_size") or 0))
    if strategy not in ("tensor", "channel", "token", "block", "group"):
        raise UnsupportedError(f"compressed-tensors {what}: strategy {strategy!r} is not "
                               "supported; supported: tensor, channel, token, block, group")
    return ScaleDescriptor(kind, strategy, bool(spec.get("dynamic", False)), shape)
