"""Tuning tables: layering, bucket lookup, canonical device names."""

from __future__ import annotations

import json

import pytest

from hwplug.errors import ConfigError
from hwplug.kernel_registry.tuning import TuningTable
from hwplug.platforms.device_names import canonical_device_name

DEFAULT = {"default": {"1": {"warps": 1}, "64": {"warps": 4}, "1024": {"warps": 8}}}
PLUGIN = {"h100": {"64": {"warps": 2}, "4096": {"warps": 16}}}


def test_bucket_lookup_exact_then_smallest_fitting_then_largest(tmp_path):
    table = TuningTable("op", DEFAULT, user_dir=tmp_path)
    assert table.lookup("default", 64) == {"warps": 4}
    assert table.lookup("default", 65) == {"warps": 8}
    assert table.lookup("default", 10**6) == {"warps": 8}
    assert table.lookup("unknown-gpu", 2) == {"warps": 4}


def test_layers_override_in_order_and_user_wins(tmp_path):
    (tmp_path / "op.json").write_text(json.dumps({"h100": {"64": {"warps": 32}}}))
    table = TuningTable("op", DEFAULT, PLUGIN, user_dir=tmp_path)
    assert table.lookup("h100", 64) == {"warps": 32}
    assert table.lookup("h100", 100) == {"warps": 16}
    assert table.devices() == ["default", "h100"]


def test_user_dir_from_environment(tmp_path, monkeypatch):
    (tmp_path / "op.json").write_text(json.dumps({"default": {"1": {"warps": 3}}}))
    monkeypatch.setenv("HWPLUG_TUNING_DIR", str(tmp_path))
    assert TuningTable("op", DEFAULT).lookup("default", 1) == {"warps": 3}


def test_bad_tables_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="no 'default' device entry"):
        TuningTable("op", PLUGIN, user_dir=tmp_path)
    (tmp_path / "op.json").write_text("{not json")
    with pytest.raises(ConfigError, match="op.json cannot be read"):
        TuningTable("op", DEFAULT, user_dir=tmp_path)


@pytest.mark.parametrize("marketing, canonical", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("AMD Instinct MI300X", "mi300x"), ("Intel(R) Data Center GPU Max 1550", "max1550"),
    ("Tesla V100-SXM2-16GB", "v100"), ("NVIDIA L40S", "l40s"), ("NVIDIA H200", "h200"),
])
def test_canonical_device_names(marketing, canonical):
    assert canonical_device_name(marketing) == canonical
