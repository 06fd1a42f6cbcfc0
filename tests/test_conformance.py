"""The conformance kit: the built-ins and the cuda plugin pass; planted bugs fail, clearly;
what cannot run here is reported as not checked, never as passed.

Broken plugins (tests/broken_plugins.py) are installed for real as fake distributions
(tests/fake_dists.py); the kit runs in-process, through ``hwplug conformance`` and through
its pytest plugin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from broken_plugins import TYPO_PLUGIN, install_wonky, install_wonky_kernels
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
def wonky(tmp_path_factory: pytest.TempPathFactory):
    """The broken plugins' site, and the kit's reports for ``wonky``, ``wonky-kernels`` and
    ``wonky-vendor`` (run once; the site is on sys.path only during those runs, later tests
    reach it through PYTHONPATH)."""
    patch = pytest.MonkeyPatch()
    for name in ("HWPLUG_PLATFORM", "HWPLUG_PLUGINS", "HWPLUG_STRICT_PLUGINS"):
        patch.delenv(name, raising=False)
    fake = FakeSite(tmp_path_factory.mktemp("wonky") / "site")
    install_wonky(fake)
    install_wonky_kernels(fake)
    activate_site(fake, patch)
    try:
        reports = {name: run_conformance(name)
                   for name in ("wonky", "wonky-kernels", "wonky-vendor")}
    finally:
        patch.undo()
        discovery.reset()
    return fake, reports


@pytest.fixture(scope="module")
def wonky_results(wonky):
    """``wonky``'s site and its results by check."""
    site, reports = wonky
    return site, by_check(reports["wonky"])


def run_cli(*args: str, pythonpath: Path | None = None, cwd: Path | None = None,
            module: str = "hwplug.cli.main") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HWPLUG_PLATFORM", "HWPLUG_PLUGINS", "HWPLUG_STRICT_PLUGINS")}
    env["COLUMNS"] = "250"
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)


@pytest.mark.slow
def test_builtins_pass(fresh_discovery):
    report = run_conformance("hwplug")
    assert report.ok, report.summary()
    results = by_check(report)
    for check in ("registration: names", "platform facts", "attention TORCH_PAGED: decode",
                  "attention TORCH_PAGED: sliding window", "quant method unquantized",
                  "quant method fp8", "quant method int8", "kernel rms_norm/torch_fused"):
        assert results[check][0] == "passed", (check, results[check])
    assert "fp8_e4m3 per-tensor (dynamic)" in results["quant method fp8"][1]
    # Variants gated on device features this CPU lacks are not checked here, not passed.
    features = discovery.current_platform().facts.features
    for variant in kernels.variants("linear") + kernels.variants("scaled_mm"):
        if variant.requirements.platforms == ("cpu",) and not set(variant.requirements.features) <= features:
            status, detail = results[f"kernel {variant.key}"]
            assert status == "not checked" and "needs device feature" in detail, detail
    assert report.exit_status() == (0 if report.complete else 3)


def test_a_distribution_name_selects_all_its_entry_points(fresh_discovery):
    hwplug = [check.name for check in plan(resolve_target("hwplug"))]
    cpu = [check.name for check in plan(resolve_target("cpu"))]
    assert "attention TORCH_PAGED: prefill" in hwplug and "attention TORCH_PAGED: prefill" not in cpu
    assert {name for name in cpu if name.startswith("kernel ")} <= set(hwplug)
    assert [c.name for c in plan(resolve_target("hwplug-cuda"))] == [
        c.name for c in plan(resolve_target("cuda"))]


@pytest.mark.slow
def test_cuda_plugin_matches_in_interpret_mode_and_says_so():
    proc = run_cli("conformance", "cuda", "--json")
    data = json.loads(proc.stdout)
    failed = [r for r in data["results"] if r["status"] == "failed"]
    assert not failed, failed
    assert proc.returncode == 3 and not data["complete"] and data["word"] == "SIMULATED"
    kernels = [r for r in data["results"] if r["check"].startswith("kernel ")]
    assert kernels and all(r["status"] == "simulated" for r in kernels), kernels


def test_wrong_kernel_variant_fails_with_shape_and_error(wonky_results):
    _, results = wonky_results
    status, detail = results["kernel rms_norm/forgets_weight"]
    assert status == "failed"
    assert "max abs error" in detail and "> atol" in detail and "x (" in detail, detail
    assert results["kernel silu_and_mul/good_silu"][0] == "passed"


def test_backend_reading_its_cache_in_the_wrong_layout_fails(wonky_results):
    _, results = wonky_results
    failed = [check for check, (status, _) in results.items()
              if check.startswith("attention WRONG_LAYOUT:") and status == "failed"]
    assert "attention WRONG_LAYOUT: decode" in failed, results
    assert "max abs error" in results["attention WRONG_LAYOUT: decode"][1]
    assert results["attention WRONG_LAYOUT: validate refuses unclaimed features"][0] == "passed"


def test_a_cache_write_that_breaks_on_its_layout_is_a_layout_mismatch(wonky_results):
    _, results = wonky_results
    status, detail = results["attention CARELESS_WRITE: decode"]
    assert status == "failed"
    assert detail.startswith("layout mismatch: write_kv_cache failed on the cache its "
                             "kv_cache_shape(num_blocks="), detail
    declared, ref = (tuple(int(n) for n in part.split(")")[0].split(", ")) for part in
                     (detail.split(" declares (")[1], detail.split("reference NHD cache (")[1]))
    assert declared == (2, ref[1], ref[3], ref[2], ref[4])  # WONKY_HND next to NHD
    assert "(layout WONKY_HND, " in detail and "raised " in detail


def test_layouts_and_the_variants_of_a_layout_are_checked_through_its_conversions(
        wonky_results):
    _, results = wonky_results
    assert results["kv layout WONKY_HND"][0] == "passed"
    assert results["kv layout WONKY_SWAPPED"] == (
        "failed", "float32: to_reference(from_reference(x)) is not x")
    status, detail = results["kernel paged_attention/reads_nhd"]
    assert status == "failed" and "max abs error" in detail and ", layout WONKY_HND" in detail


def test_a_kernels_only_plugin_is_checked_on_cpu_not_passed(wonky):
    _, reports = wonky
    report = reports["wonky-kernels"]
    status, detail = by_check(report)["kernel rms_norm/doubled"]
    assert status == "failed" and "max abs error" in detail
    assert "on cpu, simulating wonky-npu" in detail
    assert report.exit_status() == 1 and report.verdict().startswith("FAILED wonky-kernels")


@pytest.mark.slow
def test_a_kernel_needing_absent_hardware_is_not_checked_and_the_exit_status_says_so(wonky):
    site, reports = wonky
    report = reports["wonky-vendor"]
    status, detail = by_check(report)["kernel silu_and_mul/vendor"]
    assert status == "not checked"
    assert "No module named 'wonky_vendor_kernels'" in detail, detail
    assert report.ok and not report.complete
    assert report.exit_status() == 3 and report.exit_status(require_all=True) == 1
    assert report.verdict() == ("NOT CHECKED wonky-vendor: 4 passed, NOT CHECKED 1 (kernel "
                                "silu_and_mul/vendor), 6 skipped")
    proc = run_cli("conformance", "wonky-vendor", pythonpath=site.root)
    assert proc.returncode == 3 and "NOT CHECKED wonky-vendor" in proc.stdout, proc.stdout
    proc = run_cli("conformance", "wonky-vendor", "--require-all", pythonpath=site.root)
    assert proc.returncode == 1 and "NOT CHECKED wonky-vendor" in proc.stdout
    assert "(--require-all: every check must run on the device)" in proc.stdout


def test_quant_methods_are_checked_against_their_dequantised_weight(wonky_results):
    _, results = wonky_results
    status, detail = results["quant method int8_rows"]
    assert status == "passed" and "float32) matched x @ dequantize(W).T + bias" in detail
    status, detail = results["quant method forgets_scale"]
    assert status == "failed" and "max abs error" in detail, detail
    assert results["quant method no_oracle"] == (
        "not checked", "no oracle: quant method 'no_oracle' does not implement "
        "dequantize(layer), so it cannot be checked against x @ W.T")


@pytest.mark.parametrize("budget", [1, 25])
def test_gqa_examples_always_have_several_kv_heads(budget):
    from hwplug.conformance.backends import SCENARIOS, dtype_pairs, examples
    from hwplug.conformance.explore import first_failure
    from hwplug.kernel_registry.torch_paged import TorchPagedBackend

    gqa = next(scenario for scenario in SCENARIOS if scenario.name == "GQA")
    specs = []
    assert first_failure(examples(TorchPagedBackend, gqa, dtype_pairs(TorchPagedBackend)),
                         lambda example: specs.append(example.spec), budget) is None
    assert len(specs) == budget
    assert all(s.num_kv_heads > 1 and s.num_heads > s.num_kv_heads for s in specs), specs


def test_validate_accepting_unclaimed_features_fails(wonky_results):
    _, results = wonky_results
    assert results["attention LAX: sliding window"] == (
        "skipped", "not claimed: supports_sliding_window is False")
    status, detail = results["attention LAX: validate refuses unclaimed features"]
    assert status == "failed" and "accepts what the class does not claim: a sliding window" \
        in detail


def test_hygiene_probe_and_facts_problems_are_named(wonky_results):
    _, results = wonky_results
    assert results["registration: plugin loads"][0] == "passed"
    status, detail = results["registration: hooks"]
    assert status == "failed" and "hwplug_platform_resolved is not decorated" in detail
    status, detail = results["probe: cheap"]
    assert status == "failed" and "imported torch" in detail
    status, detail = results["platform facts"]
    assert status == "failed"
    assert "dist_backend 'wonkylink' is unknown to torch.distributed" in detail
    assert "KV-cache dtypes int8 are accepted by none of its attention backends" in detail


def test_connectors_must_round_trip(wonky_results):
    _, results = wonky_results
    status, detail = results["connector memory"]
    assert status == "passed" and "in layouts NHD, " in detail and "WONKY_BLOCKS_FIRST" in detail
    assert results["connector off_by_one"] == (
        "failed", "layout NHD: layers.0: blocks saved from ids [1, 4] differ when loaded into "
                  "ids [5, 2]")
    status, detail = results["connector dim_one"]  # right for NHD, wrong where blocks lie first
    # core's latent MLA layout, the fake plugin's, hwplug-tpu's (if there)
    first_block_layouts = ("MLA", "WONKY_BLOCKS_FIRST", "RPA_INTERLEAVED")
    assert status == "failed" and detail.split(":")[0].removeprefix("layout ") in (
        first_block_layouts), detail


def test_misspelt_hook_is_reported(site):
    module = site.module("typo")
    site.add("wonky-typo", {"hwplug.plugins": {"typo": module}}, {module: TYPO_PLUGIN})
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


@pytest.mark.slow
def test_a_probe_that_hangs_fails_the_probe_check(site, monkeypatch):
    from hwplug.conformance import probe

    module = site.module("hanging_probe")
    site.add("wonky-hangs", {"hwplug.platforms": {"hangs": f"{module}:activate"}},
             {module: "import time\n\ndef activate():\n    time.sleep(60)\n"})
    monkeypatch.setenv("HWPLUG_PROBE_TIMEOUT", "0.5")
    monkeypatch.setattr(probe, "INTERPRETER_START_S", 5.0)  # instead of a minute
    assert probe.check_probe("hangs") == ("failed", (
        "the probe did not answer within 5.5 s in a fresh interpreter (HWPLUG_PROBE_TIMEOUT "
        "plus 5 s to start it)"))


def test_unknown_plugin_lists_installed(fresh_discovery):
    with pytest.raises(UnknownNameError, match="unknown plugin 'nosuch'.*cpu.*cuda"):
        run_conformance("nosuch")


def test_check_variant_refuses_the_oracle(fresh_discovery):
    with pytest.raises(ValueError, match="oracle"):
        check_variant("rms_norm/reference")


@pytest.mark.slow
def test_pytest_plugin_makes_one_item_per_check(tmp_path, wonky_results):
    site, _ = wonky_results
    proc = run_cli("-p", "no:cacheprovider", "--hwplug-conformance=wonky", "-k",
                   "rms_norm or good_silu", "-q", pythonpath=site.root, cwd=tmp_path,
                   module="pytest")
    assert proc.returncode == 1, proc.stdout
    assert "1 failed, 1 passed" in proc.stdout
    assert "kernel rms_norm/forgets_weight: output" in proc.stdout
    assert "max abs error" in proc.stdout


@pytest.mark.slow
def test_pytest_plugin_skips_what_is_not_checked_here_unless_all_are_required(tmp_path, wonky):
    site, _ = wonky
    args = ("-p", "no:cacheprovider", "--hwplug-conformance=wonky-vendor", "-k", "silu_and_mul",
            "-q", "-rs")
    proc = run_cli(*args, pythonpath=site.root, cwd=tmp_path, module="pytest")
    assert proc.returncode == 0 and "1 skipped" in proc.stdout, proc.stdout
    assert "not checked here: cannot run on cpu, simulating wonky-npu" in proc.stdout
    proc = run_cli(*args, "--hwplug-require-all", pythonpath=site.root, cwd=tmp_path,
                   module="pytest")
    assert proc.returncode == 1 and "1 failed" in proc.stdout, proc.stdout
    assert "kernel silu_and_mul/vendor: not checked here: cannot run" in proc.stdout


def test_pytest_plugin_costs_nothing_without_the_option():
    code = ("import sys, hwplug.conformance.pytest_plugin; "
            "print(sorted(m for m in ('torch', 'hypothesis', 'hwplug.conformance.kit') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_cli_exits_non_zero_on_failure(wonky_results):
    site, _ = wonky_results
    proc = run_cli("conformance", "wonky", "--kernel-examples", "5",
                   "--attention-examples", "2", pythonpath=site.root)
    assert proc.returncode == 1
    assert "FAILED wonky" in proc.stdout and "forgets_weight" in proc.stdout
