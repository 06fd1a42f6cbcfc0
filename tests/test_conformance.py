"""The conformance kit: the built-ins and the cuda plugin pass; planted bugs fail, clearly.

Broken plugins are installed for real as fake distributions (tests/fake_dists.py); the
kit runs in-process, through ``hwplug conformance`` and through its pytest plugin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from broken_plugins import TYPO_PLUGIN, install_acme
from fake_dists import FakeSite, activate_site

from hwplug import discovery
from hwplug.conformance import check_variant, plan, resolve_target, run_conformance
from hwplug.conformance.explore import CannotRun, Failure, guarded
from hwplug.conformance.inputs import GENERATORS
from hwplug.conformance.result import Report
from hwplug.errors import UnknownNameError
from hwplug.kernel_registry import kernels
from hwplug.registry import current_source


def by_check(report: Report) -> dict[str, tuple[str, str]]:
    return {r.check: (r.status, r.detail) for r in report.results}


@pytest.fixture(scope="module")
def acme(tmp_path_factory: pytest.TempPathFactory):
    """The broken ``acme`` plugin's site, and the kit's results for it (run once; the site
    is on sys.path only during that run, later tests reach it through PYTHONPATH)."""
    patch = pytest.MonkeyPatch()
    for name in ("HWPLUG_PLATFORM", "HWPLUG_PLUGINS", "HWPLUG_STRICT_PLUGINS"):
        patch.delenv(name, raising=False)
    fake = FakeSite(tmp_path_factory.mktemp("acme") / "site")
    install_acme(fake)
    activate_site(fake, patch)
    try:
        results = by_check(run_conformance("acme"))
    finally:
        patch.undo()
        discovery.reset()
    return fake, results


def run_cli(*args: str, pythonpath: Path | None = None, cwd: Path | None = None,
            module: str = "hwplug.cli.main") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HWPLUG_PLATFORM", "HWPLUG_PLUGINS", "HWPLUG_STRICT_PLUGINS")}
    env["COLUMNS"] = "250"
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)


def test_builtins_pass(fresh_discovery):
    report = run_conformance("hwplug")
    assert report.ok, report.summary()
    results = by_check(report)
    for check in ("registration: names", "platform facts", "attention TORCH_PAGED: decode",
                  "attention TORCH_PAGED: sliding window", "quant method unquantized",
                  "kernel rms_norm/torch_fused"):
        assert results[check][0] == "passed", (check, results[check])


def test_a_distribution_name_selects_all_its_entry_points(fresh_discovery):
    hwplug = [check.name for check in plan(resolve_target("hwplug"))]
    cpu = [check.name for check in plan(resolve_target("cpu"))]
    assert "attention TORCH_PAGED: prefill" in hwplug and "attention TORCH_PAGED: prefill" not in cpu
    assert {name for name in cpu if name.startswith("kernel ")} <= set(hwplug)
    assert [c.name for c in plan(resolve_target("hwplug-cuda"))] == [
        c.name for c in plan(resolve_target("cuda"))]


def test_cuda_plugin_passes_in_interpret_mode():
    proc = run_cli("conformance", "cuda", "--json")
    data = json.loads(proc.stdout)
    failed = [r for r in data["results"] if r["status"] == "failed"]
    assert proc.returncode == 0 and not failed, failed
    kernels = [r for r in data["results"] if r["check"].startswith("kernel ")]
    assert any(r["status"] == "passed" for r in kernels), kernels


def test_wrong_kernel_variant_fails_with_shape_and_error(acme):
    _, results = acme
    status, detail = results["kernel rms_norm/forgets_weight"]
    assert status == "failed"
    assert "max abs error" in detail and "> atol" in detail and "x (" in detail, detail
    assert results["kernel silu_and_mul/good_silu"][0] == "passed"


def test_backend_reading_its_cache_in_the_wrong_layout_fails(acme):
    _, results = acme
    failed = [check for check, (status, _) in results.items()
              if check.startswith("attention WRONG_LAYOUT:") and status == "failed"]
    assert "attention WRONG_LAYOUT: decode" in failed, results
    assert "max abs error" in results["attention WRONG_LAYOUT: decode"][1]
    assert results["attention WRONG_LAYOUT: validate refuses unclaimed features"][0] == "passed"


def test_validate_accepting_unclaimed_features_fails(acme):
    _, results = acme
    assert results["attention LAX: sliding window"] == (
        "skipped", "not claimed: supports_sliding_window is False")
    status, detail = results["attention LAX: validate refuses unclaimed features"]
    assert status == "failed" and "accepts what the class does not claim: a sliding window" \
        in detail


def test_hygiene_probe_and_facts_problems_are_named(acme):
    _, results = acme
    assert results["registration: plugin loads"][0] == "passed"
    status, detail = results["registration: hooks"]
    assert status == "failed" and "hwplug_register_quant_methods is not decorated" in detail
    status, detail = results["probe: cheap"]
    assert status == "failed" and "imported torch" in detail
    status, detail = results["platform facts"]
    assert status == "failed"
    assert "dist_backend 'acmelink' is unknown to torch.distributed" in detail
    assert "KV-cache dtypes fp8_e4m3 are accepted by none of its attention backends" in detail


def test_connectors_must_round_trip(acme):
    _, results = acme
    assert results["connector memory"][0] == "passed"
    assert results["connector off_by_one"] == (
        "failed", "layers.0: blocks [1, 4] differ after save then load")


def test_misspelt_hook_is_reported(site):
    module = site.module("typo")
    site.add("acme-typo", {"hwplug.plugins": {"typo": module}}, {module: TYPO_PLUGIN})
    results = by_check(run_conformance("typo"))
    status, detail = results["registration: plugin loads"]
    assert status == "failed" and "unknown hook 'hwplug_register_kernal'" in detail
    assert results["registration: hooks"][0] == "failed"
    assert results["probe: cheap"][0] == "skipped"


def _perturbed(reference):
    """The reference, then every floating output (or, for in-place ops, argument) skewed."""
    def impl(*args, **kwargs):
        out = reference(*args, **kwargs)
        if out is None:
            for arg in args:
                if isinstance(arg, torch.Tensor) and arg.is_floating_point():
                    arg.copy_(arg.float() * 1.5 + 0.5)
            return None
        outs = out if isinstance(out, tuple) else (out,)
        skewed = tuple((o.float() * 1.5 + 0.5).to(o.dtype) for o in outs)
        return skewed if isinstance(out, tuple) else skewed[0]
    return impl


@pytest.fixture
def private_variants(fresh_discovery):
    """Register variants under a private source; drop them afterwards."""
    token = current_source.set("test_conformance")
    yield kernels
    current_source.reset(token)
    kernels.drop_source("test_conformance")


@pytest.mark.parametrize("op", sorted(GENERATORS))
def test_every_op_has_inputs_that_tell_right_from_wrong(op, private_variants):
    reference = private_variants.op(op).reference
    private_variants.register_variant(op, "faithful", lambda *a, **k: reference(*a, **k))
    private_variants.register_variant(op, "skewed", _perturbed(reference))
    faithful = check_variant(f"{op}/faithful", examples=8)
    assert faithful.status == "passed" and "8 inputs matched" in faithful.detail, faithful
    skewed = check_variant(f"{op}/skewed", examples=8)
    assert skewed.status == "failed" and "max abs error" in skewed.detail, skewed


def _import_missing_library():
    import acme_vendor_library_not_installed  # noqa: F401


def _import_missing_submodule():
    import hwplug.no_such_module  # noqa: F401


def _ask_torch_for_a_missing_device():
    torch.cuda.get_device_properties(10**6)  # torch raises AssertionError: no such device


def _read_missing_file():
    torch.load("/nonexistent/tuning.pt")  # raised inside torch, but not about the device


@pytest.mark.parametrize("call, verdict", [
    (_import_missing_library, CannotRun),
    (_ask_torch_for_a_missing_device, CannotRun),
    (_import_missing_submodule, Failure),  # the package is there: the code is wrong
    (_read_missing_file, Failure),
])
def test_simulated_errors_are_inconclusive_only_when_the_device_is_missing(call, verdict):
    with pytest.raises(verdict, match="at the label"):
        guarded(call, "the label", simulating=True)
    with pytest.raises(Failure):
        guarded(call, "the label", simulating=False)


def test_unknown_plugin_lists_installed(fresh_discovery):
    with pytest.raises(UnknownNameError, match="unknown plugin 'nosuch'.*cpu.*cuda"):
        run_conformance("nosuch")


def test_check_variant_refuses_the_oracle(fresh_discovery):
    with pytest.raises(ValueError, match="oracle"):
        check_variant("rms_norm/reference")


def test_pytest_plugin_makes_one_item_per_check(tmp_path, acme):
    site, _ = acme
    proc = run_cli("-p", "no:cacheprovider", "--hwplug-conformance=acme", "-k",
                   "rms_norm or good_silu", "-q", pythonpath=site.root, cwd=tmp_path,
                   module="pytest")
    assert proc.returncode == 1, proc.stdout
    assert "1 failed, 1 passed" in proc.stdout
    assert "kernel rms_norm/forgets_weight: output" in proc.stdout
    assert "max abs error" in proc.stdout


def test_pytest_plugin_costs_nothing_without_the_option():
    code = ("import sys, hwplug.conformance.pytest_plugin; "
            "print(sorted(m for m in ('torch', 'hypothesis', 'hwplug.conformance.kit') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_cli_exits_non_zero_on_failure(acme):
    site, _ = acme
    proc = run_cli("conformance", "acme", "--kernel-examples", "5",
                   "--attention-examples", "2", pythonpath=site.root)
    assert proc.returncode == 1
    assert "FAILED acme" in proc.stdout and "forgets_weight" in proc.stdout
