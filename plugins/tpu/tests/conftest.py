"""Fixtures of hwplug-tpu's tests.

Without a TPU the plugin runs on JAX's CPU backend standing in for one, the documented
way: ``JAX_PLATFORMS=cpu`` with ``HWPLUG_PLATFORM=tpu``, here with two JAX CPU devices
(``XLA_FLAGS``, set below for the whole session) so that the plugin computes on one that
is not the host's. ``stand_in`` is the platform discovery makes then, with the probe's
stand-in sighting. This folder is put on ``sys.path`` for its test helpers
(``pallas_interpreter``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hwplug import discovery
from hwplug_tpu.platform import TpuPlatform

sys.path.insert(0, str(Path(__file__).parent))
#: Two JAX CPU devices (set before JAX starts its backends): the stand-in computes on the
#: second, apart from the host memory torch's tensors live in, as on a TPU.
TWO_DEVICES = "--xla_force_host_platform_device_count=2"
if TWO_DEVICES not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TWO_DEVICES}".strip()


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch, fresh_discovery) -> TpuPlatform:
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("HWPLUG_PLATFORM", "tpu")
    discovery.reset()
    platform = discovery.current_platform()
    assert isinstance(platform, TpuPlatform) and platform.sighting.devices == ("JAX CPU",)
    return platform
