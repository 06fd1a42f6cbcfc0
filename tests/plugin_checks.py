"""Checks every hardware plugin's own tests share (importable as ``plugin_checks``).

Hardware is simulated at the probe boundary only: a plugin's ``activate`` entry point is
called with the root of a fake ``/proc`` + ``/sys`` tree (``fake_hw``) and the vendor
probe's options.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from hwplug.attention import AttentionSpec, select_backend
from hwplug.config import EngineConfig
from hwplug.errors import UnsupportedError
from hwplug.platform import Platform
from hwplug.registry import import_object


def check_activate(name: str, root: Path, expected: str | None, platform_cls: type[Platform],
                   **probe_options: Any) -> None:
    """The ``hwplug.platforms`` entry point ``name``, asked about the tree at ``root``,
    answers ``expected`` (the ``"module:Class"`` of ``platform_cls``, or None)."""
    (ep,) = [ep for ep in entry_points(group="hwplug.platforms") if ep.name == name]
    target = ep.load()(root, **probe_options)
    assert target == expected
    if target is not None:
        assert import_object(target) is platform_cls and platform_cls.name == ep.name


def check_no_attention_backend(platform: Platform, num_heads: int, num_kv_heads: int,
                               dtype: str) -> None:
    """Asking ``platform`` for an attention backend, directly or by configuring an engine,
    is an :class:`UnsupportedError` that says its plugin has registered none."""
    message = (f"platform '{platform.name}' declares no attention backend: its plugin has "
               "not registered one yet")
    with pytest.raises(UnsupportedError) as excinfo:
        select_backend(platform, AttentionSpec(num_heads, num_kv_heads, 128, dtype))
    assert str(excinfo.value) == message
    with pytest.raises(UnsupportedError, match=message):
        platform.check_and_update_config(
            EngineConfig(num_heads, num_kv_heads, 128, dtype=dtype))
