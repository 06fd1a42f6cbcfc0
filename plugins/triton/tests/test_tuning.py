"""hwplug-triton's tuning tables: complete defaults, one file per device keyed by its
canonical name, the user's layer on top, and the unknown-device fallback that says once
how to add a table."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hwplug.errors import UnknownNameError
from hwplug.platforms.device_names import canonical_device_name
from hwplug_triton import tuning

#: A marketing name of each device that has a shipped table.
DEVICES = {"h100": "NVIDIA H100 80GB HBM3", "mi300x": "AMD Instinct MI300X",
           "max1550": "Intel(R) Data Center GPU Max 1550"}


@pytest.fixture
def fresh_tables(monkeypatch, fresh_discovery):
    """Tables and device keys rebuilt for the test (and after it)."""
    def clear() -> None:
        tuning.table.cache_clear()
        tuning.device_key.cache_clear()

    clear()
    yield monkeypatch
    clear()


def test_every_kernel_has_a_complete_default_config() -> None:
    for kernel, keys in tuning.CONFIG_KEYS.items():
        for size in (1, 128, 10**7):  # below, inside and beyond the buckets
            assert keys <= tuning.launch_config(kernel, torch.device("cpu"), size).keys()


def test_unknown_kernel_config_names_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match="paged_attention_decode"):
        tuning.launch_config("flash_mla", torch.device("cpu"), 1)


def test_each_device_table_is_keyed_by_its_canonical_name() -> None:
    tables = {entry["device"]: entry for entry in tuning.shipped_tables()}
    assert set(tables) == {"default", *DEVICES}
    for device, marketing_name in DEVICES.items():
        assert canonical_device_name(marketing_name) == device
        entry = tables[device]
        assert (tuning.TABLE_DIR / tuning.table_file_name(entry["vendor"], device)).exists()
        assert "not" in entry["source"] or "tune_triton" in entry["source"], entry["source"]
    decode = tuning.table("paged_attention_decode")
    assert decode.lookup("mi300x", 4096)["num_stages"] == 1  # AMD: one pipeline stage
    assert decode.lookup("h100", 4096)["num_stages"] == 3
    assert decode.lookup("default", 4096)["num_stages"] == 2


def test_an_unknown_device_uses_default_and_says_once_how_to_add_a_table(fresh_tables,
                                                                         caplog) -> None:
    caplog.set_level(logging.WARNING, logger=tuning.__name__)
    name = "a100"  # the device's answer (a driver's name), simulated: no table for it
    fresh_tables.setattr(tuning, "torch_device_name", lambda device_type, index: "NVIDIA A100")
    for _ in range(3):
        config = tuning.launch_config("rms_norm", torch.device("meta"), 4096)
    assert config == tuning.table("rms_norm").lookup("default", 4096)
    (record,) = caplog.records
    message = record.getMessage()
    assert f"no Triton tuning table for NVIDIA A100 ({name!r}" in message
    assert "benchmarks/tune_triton.py" in message and "HWPLUG_TUNING_DIR" in message


def test_a_user_table_is_layered_over_the_shipped_ones(fresh_tables, tmp_path) -> None:
    name = "a100"
    fresh_tables.setattr(tuning, "torch_device_name", lambda device_type, index: "NVIDIA A100")
    (tmp_path / "rms_norm.json").write_text(json.dumps({name: {"64": {"num_warps": 2}}}))
    fresh_tables.setenv("HWPLUG_TUNING_DIR", str(tmp_path))
    assert tuning.device_key("meta", 0) == name
    assert tuning.launch_config("rms_norm", torch.device("meta"), 64) == {"num_warps": 2}
    # kernels the user did not tune keep the default table
    assert tuning.launch_config("gated_activation", torch.device("meta"), 64) == \
        tuning.table("gated_activation").lookup("default", 64)


@pytest.mark.skipif(torch.cuda.is_available() or (hasattr(torch, "xpu") and
                                                 torch.xpu.is_available()),
                    reason="a GPU is present: the tuner would tune it")
@pytest.mark.slow
def test_the_tuner_refuses_to_run_without_a_gpu() -> None:
    """benchmarks/tune_triton.py measures only on the device it writes a table for."""
    script = Path(__file__).resolve().parents[3] / "benchmarks" / "tune_triton.py"
    before = sorted(tuning.TABLE_DIR.iterdir())
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert "no GPU here" in proc.stderr and "Nothing was written" in proc.stderr
    assert sorted(tuning.TABLE_DIR.iterdir()) == before
