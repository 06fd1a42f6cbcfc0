"""Shared fixtures: a clean discovery state and a private cache dir for every test session."""

from __future__ import annotations

import pytest

from hwplug import discovery


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
    for name in ("HWPLUG_PLATFORM", "HWPLUG_PLUGINS", "HWPLUG_STRICT_PLUGINS"):
        monkeypatch.delenv(name, raising=False)
    discovery.reset()
    yield discovery
    discovery.reset()
