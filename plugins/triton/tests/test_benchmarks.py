"""``benchmarks/bench_quant.py`` and ``bench_mla.py`` run end to end (``--smoke``: tiny
shapes in the Triton interpreter) and, without a GPU, refuse to measure with a message
saying so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # each test runs a benchmark script in a fresh interpreter

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_quant.py"

GPU = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
#: ``--smoke`` is the interpreter's path, CI's; a GPU machine measures for real
#: (benchmarks/device_check.sh), and older Tritons' interpreters (3.6) fail on these kernels.
interpreter_only = pytest.mark.skipif(GPU, reason="a GPU is present: --smoke runs the kernels "
                                                  "in Triton's interpreter, for machines without")


def run(*args: str, script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True,
                          text=True, timeout=300, cwd=script.parent)


@interpreter_only
def test_the_smoke_run_reports_every_section_with_its_difference_from_the_reference() -> None:
    proc = run("--smoke")
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    ggml_row = next(line for line in rows if line.startswith("| Q4_K | tiny 64 x 512 | 20 |"))
    fp8_row = next(line for line in rows if line.startswith("| tiny 256 x 256 | 20 |"))
    for row in (ggml_row, fp8_row):  # the last cell: the largest difference, a number
        float(row.rstrip(" |").rsplit("|", 1)[1])
    assert "written to" not in proc.stdout  # --smoke writes nothing unless told where


@pytest.mark.skipif(GPU, reason="a GPU is present: the benchmark would measure it")
def test_without_a_gpu_it_measures_nothing_and_says_why() -> None:
    proc = run()
    assert proc.returncode == 1
    assert "no GPU (CUDA, ROCm or XPU): run on a GPU machine, or pass --smoke" in proc.stderr
    assert not SCRIPT.with_name("RESULTS_quant.md").exists()


@interpreter_only
def test_the_mla_smoke_run_reports_the_kernel_beside_the_reference() -> None:
    proc = run("--smoke", script=SCRIPT.with_name("bench_mla.py"))
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| 2 x 40 | fp32 |"))
    assert float(row.rstrip(" |").rsplit("|", 1)[1]) < 1e-5  # relative to the largest output
    assert "written to" not in proc.stdout
