"""hwplug-acme-npu against hwplug's conformance kit, its device simulated by a file.

The probe looks for a device node; pointing ACME_NPU_DEVICE_NODE at a temporary file makes
it see a device on any machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hwplug.conformance import run_conformance

from hwplug_acme_npu import probe


@pytest.fixture
def device_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    node = tmp_path / "acme_npu0"
    node.touch()
    monkeypatch.setenv(probe.DEVICE_NODE_ENV, str(node))
    return node


def test_probe_follows_the_device_node(device_node: Path, monkeypatch: pytest.MonkeyPatch):
    answer = probe.activate()
    assert answer.platform == probe.PLATFORM_CLASS
    assert answer.sighting.evidence == str(device_node)
    monkeypatch.setenv(probe.DEVICE_NODE_ENV, str(device_node.with_name("absent")))
    assert probe.activate() is None


def test_conformance(device_node: Path):
    report = run_conformance("acme-npu")
    assert report.ok, report.summary()
