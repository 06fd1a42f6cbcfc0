"""``benchmarks/decode_cpu_time.py`` runs end to end on the packaged SmolLM2 GGUF (hwplug's
engine only: llama.cpp is not in CI's environment): a CPU and a wall time per decode step
at every batch size, and a missing model file is refused with its name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hwplug.model_zoo.loaders import resolve_model

pytestmark = pytest.mark.slow  # runs the benchmark script in fresh interpreters

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "decode_cpu_time.py"


def test_a_run_prints_cpu_and_wall_ms_per_decode_step_per_batch():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--model", str(resolve_model(None)),
                           "--engines", "hwplug", "--batch-sizes", "1", "3", "--new-tokens",
                           "3", "--repeats", "1", "--prompt-tokens", "8"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("hwplug "))
    cpu1, wall1, per_s1, cpu3, wall3, per_s3 = (float(v) for v in row.split()[1:])
    assert cpu1 > 0 and wall1 > 0 and cpu3 > 0 and wall3 > 0
    assert per_s1 == pytest.approx(1e3 / cpu1, rel=0.01)
    assert per_s3 == pytest.approx(3e3 / cpu3, rel=0.01)


def test_a_missing_model_is_refused_with_its_name(tmp_path):
    missing = tmp_path / "none.gguf"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--model", str(missing)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"--model {missing}: no such file" in proc.stderr
