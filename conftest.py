"""Set-up for every test session in this repository (core and plugin tests alike).

Without a GPU, the Triton kernels run in Triton's interpreter, which Triton picks from
``TRITON_INTERPRET`` when it is first imported. This file is loaded before any test
module, so the variable is set before anything (transformers, the conformance kit) can
import triton. The fixtures here serve core and plugin tests.
"""

from __future__ import annotations

import os

import pytest
import torch

from hwplug import discovery

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

#: Variables that steer discovery; tests start without them.
DISCOVERY_VARIABLES = ("HWPLUG_PLATFORM", "HWPLUG_PLUGINS", "HWPLUG_STRICT_PLUGINS",
                       "HWPLUG_PROBE_ROOT")


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Converted tokenizers and weights go to a session temp dir, not the user's cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HWPLUG_CACHE_DIR", str(tmp_path_factory.mktemp("hwplug-cache")))
    yield
    mp.undo()


@pytest.fixture
def fresh_discovery(monkeypatch: pytest.MonkeyPatch):
    """Run the test against a fresh discovery, and leave a fresh one behind."""
    for name in DISCOVERY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    discovery.reset()
    yield discovery
    discovery.reset()
