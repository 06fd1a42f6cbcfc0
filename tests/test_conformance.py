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
from fake_dists import FakeSite, activate_site

from hwplug import discovery
from hwplug.conformance import check_variant, plan, resolve_target, run_conformance
from hwplug.conformance.explore import CannotRun, Failure, guarded
from hwplug.conformance.inputs import GENERATORS
from hwplug.conformance.result import Report
from hwplug.errors import UnknownNameError
from hwplug.kernel_registry import kernels
from hwplug.registry import current_source

ACME_PLATFORM = """
from hwplug.platform import Platform

class AcmePlatform(Platform):
    name = "acme"
    device_type = "cpu"
    vendor = "acme"
    is_accelerator = True
    dist_backend = "acmelink"
    supported_dtypes = ("float32", "bfloat16")
    supported_kv_cache_dtypes = ("float32", "fp8_e4m3")
    attention_backend_priority = ("WRONG_LAYOUT", "REFERENCE")

def activate():
    import torch  # a probe must not import torch
    return __name__ + ":AcmePlatform"
"""

# Each thing here is broken in one realistic way, except good_silu and MemoryConnector.
ACME_PLUGIN = """
import torch
from hwplug import hookimpl
from hwplug.connector import Connector
from hwplug.kernel_registry import ops
from hwplug.kernel_registry.attention_backend import ReferenceBackend

hwplug_api_version = ">=1,<2"


def rms_norm_forgets_weight(x, weight, eps, residual=None):
    if residual is not None:
        summed = x + residual
        return rms_norm_forgets_weight(summed, weight, eps), summed
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)).to(x.dtype)


def good_silu(x):
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)


class WrongLayout(ReferenceBackend):
    '''Stores K/V as HND, as kv_cache_shape says, but attends reading the bytes as NHD.'''

    kv_cache_layout = "HND"

    @classmethod
    def get_name(cls):
        return "WRONG_LAYOUT"

    @classmethod
    def kv_cache_shape(cls, num_blocks, block_size, num_kv_heads, head_size):
        return (2, num_blocks, num_kv_heads, block_size, head_size)

    def write_kv_cache(self, key, value, kv_cache, metadata):
        ops.reshape_and_cache(key, value, kv_cache.transpose(2, 3), metadata.slot_mapping)

    def forward(self, query, key, value, kv_cache, metadata, scale):
        self.write_kv_cache(key, value, kv_cache, metadata)
        two, blocks, heads, block_size, size = kv_cache.shape
        as_nhd = kv_cache.view(two, blocks, block_size, heads, size)
        spec = self.spec
        return ops.paged_attention(query, as_nhd, metadata.block_tables, metadata.seq_lens,
                                   metadata.query_start_loc, scale, spec.causal,
                                   spec.sliding_window, spec.soft_cap)


class Lax(ReferenceBackend):
    '''Claims no sliding window, but its validate accepts anything.'''

    supports_sliding_window = False

    @classmethod
    def get_name(cls):
        return "LAX"

    @classmethod
    def validate(cls, spec, platform=None):
        return []


class MemoryConnector(Connector):
    def __init__(self, layout, policy=None):
        super().__init__(layout, policy)
        self._store = {}

    @classmethod
    def get_name(cls):
        return "memory"

    def save_kv_layer(self, layer_name, kv_layer, metadata):
        for request, blocks in metadata.saves.items():
            self._store[request, layer_name] = kv_layer[:, blocks].clone()

    def wait_for_save(self):
        pass

    def start_load_kv(self, metadata, kv_caches):
        for request, blocks in metadata.loads.items():
            for name, cache in kv_caches.items():
                cache[:, self._slots(blocks)] = self._store[request, name]

    def wait_for_layer_load(self, layer_name):
        pass

    def _slots(self, blocks):
        return blocks


class OffByOneConnector(MemoryConnector):
    @classmethod
    def get_name(cls):
        return "off_by_one"

    def _slots(self, blocks):
        return [b + 1 for b in blocks]


@hookimpl
def hwplug_register_kernels(registry):
    registry.register_variant("rms_norm", "forgets_weight", rms_norm_forgets_weight,
                              platforms=("acme",))
    registry.register_variant("silu_and_mul", "good_silu", good_silu, platforms=("acme",))


@hookimpl
def hwplug_register_attention_backends(registry):
    registry.register("WRONG_LAYOUT", WrongLayout)
    registry.register("LAX", Lax)


@hookimpl
def hwplug_register_connectors(registry):
    registry.register("memory", MemoryConnector)
    registry.register("off_by_one", OffByOneConnector)


def hwplug_register_quant_methods(registry):  # the @hookimpl is missing
    pass
"""

TYPO_PLUGIN = """
from hwplug import hookimpl

hwplug_api_version = ">=1,<2"

@hookimpl
def hwplug_register_kernal(registry):
    pass
"""


def by_check(report: Report) -> dict[str, tuple[str, str]]:
    return {r.check: (r.status, r.detail) for r in report.results}


def install_acme(site: FakeSite) -> None:
    platform, plugin = site.module("acme_platform"), site.module("acme_plugin")
    site.add("acme-hw", {"hwplug.platforms": {"acme": f"{platform}:activate"},
                         "hwplug.plugins": {"acme": plugin}},
             {platform: ACME_PLATFORM, plugin: ACME_PLUGIN})


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_discovery) -> FakeSite:
    fake = FakeSite(tmp_path / "site")
    activate_site(fake, monkeypatch)
    return fake


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
    report = run_conformance("cpu")
    assert report.ok, report.summary()
    results = by_check(report)
    for check in ("registration: names", "platform facts", "attention REFERENCE: decode",
                  "attention REFERENCE: sliding window", "quant method unquantized"):
        assert results[check][0] == "passed", (check, results[check])


def test_hwplug_names_the_builtins_too(fresh_discovery):
    names = [check.name for check in plan(resolve_target("hwplug"))]
    assert names == [check.name for check in plan(resolve_target("cpu"))]
    assert "attention REFERENCE: prefill" in names


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
