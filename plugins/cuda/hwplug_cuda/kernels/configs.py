"""Launch configs of the Triton kernels: data in ``configs.json`` beside this module.

The file maps ``kernel -> device -> bucket -> config``. ``device`` is a canonical device
name (``"h100"``, as the platform names its device) or ``"default"``,
which every kernel has, so a lookup never raises on the hot path. The bucket of each
kernel:

========================  =============================================
kernel                    bucket
========================  =============================================
rms_norm                  hidden size
gated_activation          output width ``d``
rotary_embedding          head size
reshape_and_cache         head size
paged_attention_decode    longest context (``max_seq_len``)
paged_attention_prefill   head size
========================  =============================================

Every config of a kernel holds the keys :data:`CONFIG_KEYS` lists (the shipped file is
checked when a kernel's table is first built). Lookup is
:class:`hwplug.kernel_registry.tuning.TuningTable`'s: the device's own buckets (else the
default's), the exact bucket, else the smallest that fits, else the largest. A user
table ``$HWPLUG_TUNING_DIR/<kernel>.json`` of the same ``device -> bucket -> config``
shape is layered over the shipped one.
"""

from __future__ import annotations

import json
import logging
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hwplug.discovery import current_platform
from hwplug.errors import ConfigError, UnknownNameError
from hwplug.kernel_registry.tuning import TuningTable

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

CONFIG_FILE = Path(__file__).with_name("configs.json")

#: The keys each kernel's launcher reads from its config.
CONFIG_KEYS: dict[str, frozenset[str]] = {
    "rms_norm": frozenset({"num_warps"}),
    "gated_activation": frozenset({"block", "num_warps"}),
    "rotary_embedding": frozenset({"tile", "num_warps"}),
    "reshape_and_cache": frozenset({"tile", "num_warps"}),
    "paged_attention_decode": frozenset(
        {"block_n", "num_warps", "num_stages", "min_split_tokens", "waves"}),
    "paged_attention_prefill": frozenset({"block_m", "block_n", "num_warps", "num_stages"}),
}


def launch_config(kernel: str, device: torch.device, size: int) -> dict[str, Any]:
    """The config of ``kernel`` for a call of bucket value ``size`` on ``device``.

    Raises :class:`~hwplug.errors.UnknownNameError` for a kernel the file does not list.
    The returned dict is shared: read it, do not modify it.
    """
    return _table(kernel).lookup(device_key(device.type, device.index), size)


@cache
def device_key(device_type: str, index: int | None) -> str:
    """The platform's canonical name of a CUDA device (``"h100"``); ``"default"`` for any
    other device (the Triton interpreter on CPU)."""
    if device_type != "cuda":
        return "default"
    name = current_platform().canonical_device_name(index or 0)
    logger.debug("tuning tables of cuda:%s read as %r", index, name)
    return name


@cache
def _table(kernel: str) -> TuningTable:
    if kernel not in CONFIG_KEYS:
        raise UnknownNameError("Triton kernel config", kernel, CONFIG_KEYS)
    layer = _shipped_layers().get(kernel, {})
    for device, buckets in layer.items():
        for bucket, config in buckets.items():
            missing = CONFIG_KEYS[kernel] - config.keys()
            if missing:
                raise ConfigError(f"{CONFIG_FILE}: {kernel}/{device}/{bucket} lacks "
                                  f"{', '.join(sorted(missing))}")
    return TuningTable(kernel, layer)


@cache
def _shipped_layers() -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    return json.loads(CONFIG_FILE.read_text())
