"""Kernel tuning tables: launch configs as data, layered and keyed by device and bucket.

A table maps ``device -> bucket -> config`` for one op, where ``device`` is a canonical
device name (``"h100"``, see :mod:`hwplug.kernel_registry.device_names`) or ``"default"``
and ``bucket`` a size (e.g. num_tokens) written as a string key in JSON. Layers stack
``default < plugin < device < user``: a later layer's entry replaces an earlier one's for
the same (device, bucket). User tables are ``$HWPLUG_TUNING_DIR/<op>.json``.

Lookup never raises on the hot path once a ``"default"`` device entry exists: the
device's own buckets are tried, then the default's; within them the exact size, then the
smallest bucket that fits (>= size), else the largest.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hwplug import envs
from hwplug.errors import ConfigError

Config = dict[str, Any]
Layer = Mapping[str, Mapping[str, Config]]


def read_layer(path: Path) -> dict[str, dict[str, Config]]:
    """Load one JSON layer ``{device: {bucket: config}}``; a malformed file is an error."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"tuning table {path} cannot be read: {exc}") from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError(f"tuning table {path} must map device -> bucket -> config")
    return data


class TuningTable:
    """The merged configs of one op; build once, look up per call."""

    def __init__(self, op: str, *layers: Layer, user_dir: Path | None = None) -> None:
        self.op = op
        merged: dict[str, dict[int, Config]] = {}
        user_dir = user_dir or envs.HWPLUG_TUNING_DIR
        user = [read_layer(user_dir / f"{op}.json")] if user_dir and (
            user_dir / f"{op}.json").exists() else []
        for layer in (*layers, *user):
            for device, buckets in layer.items():
                target = merged.setdefault(device, {})
                for bucket, config in buckets.items():
                    target[int(bucket)] = dict(config)
        if "default" not in merged:
            raise ConfigError(f"tuning table of {op} has no 'default' device entry")
        self._tables = {device: (sorted(b), b) for device, b in merged.items()}

    def lookup(self, device: str, size: int) -> Config:
        """The config for ``size`` on ``device`` (falls back to ``"default"``)."""
        keys, configs = self._tables.get(device) or self._tables["default"]
        index = bisect.bisect_left(keys, size)
        return configs[keys[min(index, len(keys) - 1)]]

    def devices(self) -> list[str]:
        return sorted(self._tables)
