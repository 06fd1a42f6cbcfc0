"""Launch configs of the Triton kernels: tuning tables as data, one JSON file per device.

``tables/default.json`` holds a config for every kernel (so a lookup never raises on the
hot path); ``tables/<vendor>_<device>.json`` (``nvidia_h100.json``, ``amd_mi300x.json``,
``intel_max1550.json``) holds one device's, keyed by the device's canonical name (from
the name torch gives it, :func:`hwplug.platforms.device_names.canonical_device_name`:
``h100``, ``mi300x``, ``max1550``).
Each file is ``{"device", "source", "kernels": {kernel: {bucket: config}}}``; ``source``
says where its numbers come from (hand-set, or ``benchmarks/tune_triton.py`` on the
device, with the date). The bucket of each kernel:

========================  =============================================
kernel                    bucket
========================  =============================================
rms_norm                  hidden size
gated_activation          output width ``d``
rotary_embedding          head size
reshape_and_cache         head size
paged_attention_decode    longest context (``max_seq_len``)
paged_attention_prefill   head size
ggml_matmul               activation rows M (``ggml_linear``)
ggml_embedding            row width K
moe_matmul                (token, expert) pairs ``T * k`` (``moe_experts``)
fp8_matmul                activation rows M (``scaled_mm``)
mla_attention             latent width ``L`` (``kv_lora_rank``)
========================  =============================================

Layers stack ``default`` < the device's table < the user's
(``$HWPLUG_TUNING_DIR/<kernel>.json``, ``{device: {bucket: config}}``), and lookup is
:class:`hwplug.kernel_registry.tuning.TuningTable`'s: the device's own buckets (else the
default's), the exact bucket, else the smallest that fits, else the largest. A device
without a table uses ``default``, and says so once, with how to add one.
"""

from __future__ import annotations

import json
import logging
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hwplug.errors import ConfigError, UnknownNameError
from hwplug.kernel_registry.tuning import TuningTable
from hwplug.platforms.device_names import canonical_device_name

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

TABLE_DIR = Path(__file__).with_name("tables")
DEFAULT = "default"

#: The keys each kernel's launcher reads from its config.
CONFIG_KEYS: dict[str, frozenset[str]] = {
    "rms_norm": frozenset({"num_warps"}),
    "gated_activation": frozenset({"block", "num_warps"}),
    "rotary_embedding": frozenset({"tile", "num_warps"}),
    "reshape_and_cache": frozenset({"tile", "num_warps"}),
    "paged_attention_decode": frozenset(
        {"block_n", "num_warps", "num_stages", "min_split_tokens", "waves"}),
    "paged_attention_prefill": frozenset({"block_m", "block_n", "num_warps", "num_stages"}),
    "ggml_matmul": frozenset(
        {"block_m", "block_n", "block_k", "split_k", "group_m", "num_warps", "num_stages"}),
    "ggml_embedding": frozenset({"block_t", "block_k", "num_warps"}),
    "moe_matmul": frozenset({"block_m", "block_n", "block_k", "num_warps", "num_stages"}),
    "fp8_matmul": frozenset(
        {"block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages"}),
    "mla_attention": frozenset(
        {"block_h", "block_n", "num_warps", "num_stages", "min_split_tokens", "waves"}),
}


def launch_config(kernel: str, device: torch.device, size: int) -> dict[str, Any]:
    """The config of ``kernel`` for a call of bucket value ``size`` on ``device``.

    Raises :class:`~hwplug.errors.UnknownNameError` for a kernel without configs. The
    returned dict is shared: read it, do not modify it.
    """
    return table(kernel).lookup(device_key(device.type, device.index), size)


@cache
def device_key(device_type: str, index: int | None) -> str:
    """The tables' key of a device: its canonical name (``"mi300x"``, from the name torch
    gives the device), or ``"default"`` on CPU (the Triton interpreter) and for a device no
    table knows."""
    if device_type == "cpu":
        return DEFAULT
    device_name = torch_device_name(device_type, index or 0)
    name = canonical_device_name(device_name)
    if any(name in table(kernel).devices() for kernel in CONFIG_KEYS):
        logger.debug("tuning tables of %s:%s read as %r", device_type, index, name)
        return name
    logger.warning(
        "no Triton tuning table for %s (%r): its kernels use the 'default' table. To add "
        "one, run `python benchmarks/tune_triton.py` on it (writes %s/<vendor>_%s.json), or "
        "put <kernel>.json files mapping {%r: {bucket: config}} in HWPLUG_TUNING_DIR",
        device_name, name, TABLE_DIR, name, name)
    return DEFAULT


def torch_device_name(device_type: str, index: int) -> str:
    """The name torch's ``device_type`` module gives device ``index`` (the driver's)."""
    import torch

    return getattr(torch, device_type).get_device_name(index)


def table_file_name(vendor: str, device: str) -> str:
    """The shipped table file of a device: ``"amd_mi300x.json"``."""
    return f"{vendor}_{device}.json"


@cache
def table(kernel: str) -> TuningTable:
    """The merged layers of ``kernel`` (built once per process)."""
    if kernel not in CONFIG_KEYS:
        raise UnknownNameError("Triton kernel config", kernel, CONFIG_KEYS)
    layers = [{entry["device"]: entry["kernels"][kernel]} for entry in shipped_tables()
              if kernel in entry["kernels"]]
    return TuningTable(kernel, *layers)


@cache
def shipped_tables() -> tuple[dict[str, Any], ...]:
    """Every table file under :data:`TABLE_DIR`, ``default`` first, checked: each names its
    device and source, and every config holds its kernel's :data:`CONFIG_KEYS`."""
    files = sorted(TABLE_DIR.glob("*.json"), key=lambda p: (p.stem != DEFAULT, p.stem))
    tables = tuple(_read(path) for path in files)
    if not tables or tables[0]["device"] != DEFAULT or set(tables[0]["kernels"]) != set(
            CONFIG_KEYS):
        raise ConfigError(f"{TABLE_DIR / 'default.json'} must hold a config for every kernel: "
                          f"{', '.join(CONFIG_KEYS)}")
    return tables


def _read(path: Path) -> dict[str, Any]:
    try:
        entry = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"tuning table {path} cannot be read: {exc}") from exc
    if not isinstance(entry, dict) or {"device", "source", "kernels"} - entry.keys():
        raise ConfigError(f"tuning table {path} must hold 'device', 'source' and 'kernels'")
    for kernel, buckets in entry["kernels"].items():
        if kernel not in CONFIG_KEYS:
            raise UnknownNameError("Triton kernel config", kernel, CONFIG_KEYS,
                                   hint=f"in tuning table {path}")
        for bucket, config in buckets.items():
            missing = CONFIG_KEYS[kernel] - config.keys()
            if missing:
                raise ConfigError(f"{path}: {kernel}/{bucket} lacks {', '.join(sorted(missing))}")
    return entry
