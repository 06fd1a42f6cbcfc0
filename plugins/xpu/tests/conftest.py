"""Fixtures of hwplug-xpu's tests: the xpu platform discovery makes for a fake Data Center
GPU Max 1550, and hwplug-triton's test helpers (``triton_cases``, put on ``sys.path``
here) for checking the IPEX calls against the reference ops (``test_ipex_cpu.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fake_hw import make_intel_tree
from plugin_checks import discovered

from hwplug.platform_interface import Platform
from hwplug_xpu import platform

sys.path.insert(0, str(Path(__file__).parents[2] / "triton" / "tests"))


@pytest.fixture
def max1550(tmp_path, monkeypatch, fresh_discovery) -> Platform:
    """The xpu platform of one Max 1550 (XMX engines), with the dtype warning unsaid."""
    make_intel_tree(tmp_path, [0x0BD5])
    platform._warn_dtype_fallback.cache_clear()
    return discovered(monkeypatch, tmp_path, "xpu")
