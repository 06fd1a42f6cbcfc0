"""Fixtures of hwplug-tpu's tests.

Without a TPU the plugin runs on JAX's CPU backend standing in for one, the documented
way: ``JAX_PLATFORMS=cpu`` with ``HWPLUG_PLATFORM=tpu``. ``stand_in`` is the platform
discovery makes then, with the probe's stand-in sighting.
"""

from __future__ import annotations

import pytest

from hwplug import discovery
from hwplug_tpu.platform import TpuPlatform


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch, fresh_discovery) -> TpuPlatform:
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("HWPLUG_PLATFORM", "tpu")
    discovery.reset()
    platform = discovery.current_platform()
    assert isinstance(platform, TpuPlatform) and platform.sighting.devices == ("JAX CPU",)
    return platform
