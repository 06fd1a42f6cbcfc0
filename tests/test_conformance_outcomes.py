"""The kit tells checked on the device, checked in simulation and not checked apart, from
what it observed (the probe's result, the tensors' device, Triton's interpreter running),
and a plugin reads PASSED only when every check ran on its device (issue 28).

The GPU and TPU plugins run here with fake hardware trees (tests/fake_hw.py): their
probes see the hardware, their runtime cannot drive it, so their kits must say SIMULATED
or NOT CHECKED, never PASSED.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_hw import make_amd_tree, make_intel_tree, make_nvidia_tree, make_tpu_tree

from hwplug import discovery
from hwplug.conformance import Placement, check_variant
from hwplug.conformance.execution import CPU_STAND_IN, INTERPRETER, Observed, ran_on
from hwplug.conformance.result import CheckResult, Report
from hwplug.kernel_registry import KernelRegistry, kernels

FAKE_TREES = {"cuda": make_nvidia_tree, "rocm": make_amd_tree, "xpu": make_intel_tree,
              "tpu": make_tpu_tree}


def _kit(plugin: str, root: Path | None, **extra: str
         ) -> tuple[subprocess.CompletedProcess[str], dict]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HWPLUG_PLATFORM", "HWPLUG_PLUGINS", "TRITON_INTERPRET",
                        "HWPLUG_PROBE_ROOT")}
    env.update(JAX_PLATFORMS="cpu", COLUMNS="250", **extra)
    if root is not None:
        env["HWPLUG_PROBE_ROOT"] = str(root)
    proc = subprocess.run([sys.executable, "-m", "hwplug.cli.main", "conformance", plugin,
                           "--kernel-examples", "2", "--attention-examples", "1", "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    return proc, json.loads(proc.stdout)


@pytest.mark.parametrize("plugin", sorted(FAKE_TREES))
def test_accelerator_plugins_on_this_machine_never_read_passed(plugin, tmp_path):
    FAKE_TREES[plugin](tmp_path)
    proc, data = _kit(plugin, tmp_path)
    results = {r["check"]: r for r in data["results"]}
    assert not [r for r in data["results"] if r["status"] == "failed"], proc.stdout
    assert data["word"] in ("SIMULATED", "NOT CHECKED") and not data["complete"]
    assert data["verdict"].startswith(data["word"]) and "PASSED" not in data["verdict"]
    assert proc.returncode == 3
    # the probe saw the (fake) device: its facts come from the sighting, checked for real
    assert results["platform facts"]["status"] == "passed"
    assert results["setup"]["status"] == "not checked"
    numerical = [r for name, r in results.items() if name.startswith(("kernel ", "attention "))
                 and not name.endswith("validate refuses unclaimed features")]
    assert numerical and not [r for r in numerical if r["status"] == "passed"], numerical
    simulated = [r for r in numerical if r["status"] == "simulated"]
    assert sum(data["simulations"].values()) == data["counts"]["simulated"]
    assert simulated and all(r["simulation"] for r in simulated)
    if plugin == "tpu":
        assert {r["simulation"] for r in simulated} == {"JAX CPU"}
    else:  # Triton kernels ran in the interpreter (counted), the backends' ops on CPU
        assert results[f"kernel rms_norm/{_triton_name(plugin)}"]["simulation"] == INTERPRETER


def test_jax_on_cpu_standing_in_for_a_tpu_is_simulated_not_passed():
    """The tpu README's way to run the kit here: HWPLUG_PLATFORM=tpu with JAX on its CPU.
    The probe reports JAX's CPU as a stand-in and the platform is 'present', yet the JAX
    kernels ran on JAX's CPU backend: simulated."""
    proc, data = _kit("tpu", None, HWPLUG_PLATFORM="tpu")
    assert data["word"] in ("SIMULATED", "NOT CHECKED") and proc.returncode == 3, proc.stdout
    jax_rows = [r for r in data["results"] if r["check"].startswith("kernel ")
                and r["check"].endswith("/jax") and r["status"] != "not checked"]
    assert jax_rows and {(r["status"], r["simulation"]) for r in jax_rows} == {
        ("simulated", "JAX CPU")}, jax_rows


def _triton_name(plugin: str) -> str:
    return {"cuda": "triton", "rocm": "triton_rocm", "xpu": "triton_xpu"}[plugin]


@pytest.mark.slow
def test_cublaslt_fp8_is_a_cpu_stand_in_here(tmp_path):
    make_nvidia_tree(tmp_path)
    _, data = _kit("cuda", tmp_path)
    row = next(r for r in data["results"] if r["check"] == "kernel scaled_mm/cublaslt_fp8")
    assert (row["status"], row["simulation"]) == ("simulated", CPU_STAND_IN), row


def test_the_cpu_platforms_own_kernels_are_checked_on_their_device(fresh_discovery):
    platform = discovery.current_platform()
    assert platform.name == "cpu"
    result = check_variant("rms_norm/torch_fused", Placement("cpu", platform), examples=3)
    assert (result.status, result.simulation) == ("passed", ""), result


def test_a_triton_kernel_is_simulated_even_where_the_platform_is_present(fresh_discovery):
    """The interpreter's launches are observed: a Triton variant for any platform, checked
    on the present cpu platform, reads simulated (TRITON_INTERPRET=1: conftest.py)."""
    hwplug_triton = pytest.importorskip("hwplug_triton")
    registry = KernelRegistry()
    op = kernels.op("silu_and_mul")
    registry.define_op(op.name, kernels.get("silu_and_mul/reference").impl, doc=op.__doc__,
                       tolerances=op.tolerances, dispatch_arg=op.dispatch_arg)
    hwplug_triton.register(registry, platforms=(), ops=("silu_and_mul",))
    (variant,) = [v for v in registry.variants("silu_and_mul") if v.name == "triton"]
    result = check_variant(variant, Placement("cpu", discovery.current_platform()),
                           examples=2)
    assert (result.status, result.simulation) == ("simulated", INTERPRETER), result


@pytest.mark.parametrize(("placement", "devices", "expected"), [
    (Placement("cpu"), {"cpu"}, ("passed", "")),
    (Placement("cpu", None, "cuda"), {"cpu"}, ("simulated", CPU_STAND_IN)),
    # a present platform whose results came back on another device: not on its device
    (Placement("cuda"), {"cpu"}, ("simulated", CPU_STAND_IN)),
])
def test_ran_on_follows_the_observed_devices(placement, devices, expected):
    assert ran_on(placement, Observed(devices), "hwplug") == expected


def _report(*statuses: str) -> Report:
    return Report("p", [CheckResult(f"c{i}", s, "", "Triton interpreter" if s == "simulated"
                                    else "") for i, s in enumerate(statuses)])


@pytest.mark.parametrize(("statuses", "word", "exit_status"), [
    (("passed", "skipped"), "PASSED", 0),
    (("passed", "simulated"), "SIMULATED", 3),
    (("passed", "simulated", "not checked"), "SIMULATED", 3),
    (("passed", "not checked"), "NOT CHECKED", 3),
    (("simulated", "failed"), "FAILED", 1),
])
def test_the_verdict_reads_passed_only_when_everything_ran_on_the_device(
        statuses, word, exit_status):
    report = _report(*statuses)
    assert report.word() == word and report.verdict().startswith(f"{word} p: ")
    assert report.exit_status() == exit_status
    assert report.exit_status(require_all=True) == (0 if word == "PASSED" else 1)
    data = report.as_json()
    assert data["word"] == word and data["complete"] == (word == "PASSED")
    if "simulated" in statuses:
        assert "SIMULATED 1 (Triton interpreter 1)" in report.verdict()
        assert data["simulations"] == {"Triton interpreter": 1}
