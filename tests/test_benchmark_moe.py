"""``benchmarks/moe.py --quick`` runs end to end: every row timed at every token count,
hwplug's output equal to transformers' within fp32 rounding, the GGUF row within 5% of
the reference's largest output (random blocks, activations rounded to int8)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the benchmark script in a fresh interpreter

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "moe.py"


def test_the_quick_run_times_every_row_and_agrees_with_transformers():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--repeat", "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for row in ("transformers eager", "transformers grouped_mm", "hwplug fused_moe fp32",
                "hwplug fused_moe reference fp32", "hwplug Q4_K ggml_moe_experts"):
        line = next(line for line in lines if line.startswith(row))
        assert len(re.findall(r"\d+\.\d+x", line)) == 2, line  # 1 and 8 tokens
    served = next(line for line in lines if line.startswith("variants that served"))
    assert "fused_moe grouped" in served and "moe_experts fused_" in served, served
    found = re.search(r"vs transformers (\S+); Q4_K ggml_moe_experts vs its reference (\S+) ",
                      proc.stdout)
    assert float(found[1]) < 1e-4 and float(found[2]) < 5e-2, proc.stdout  # wrong: ~1
