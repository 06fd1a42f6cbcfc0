"""Fixtures of the core tests (the repository's conftest.py holds those plugins share)."""

from __future__ import annotations

import pytest
from fake_dists import FakeSite, activate_site
from serve_harness import serve_llm_fixture, served_fixture  # noqa: F401 (session fixtures)


@pytest.fixture
def site(tmp_path, monkeypatch, fresh_discovery) -> FakeSite:
    """A temporary site directory on sys.path, for fake distributions, with a fresh
    discovery."""
    fake = FakeSite(tmp_path / "site")
    activate_site(fake, monkeypatch)
    return fake

#: A plugin package of a previous release, run by test_previous_release_plugin.py only.
collect_ignore_glob = ["release_0_1_plugin/*"]
