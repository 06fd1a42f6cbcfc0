"""hwplug-cpu-arm's ``int4_linear`` variants: KleidiAI through torch's ``_dyn_quant`` ops.

This x86 host's torch runs the same two ops through their portable C++ path (same
results, no speed), so the variant is checked against the op's reference by calling it
directly. Where it is chosen is checked against fake Arm trees through discovery
(hardware is simulated at the probe boundary only), and through the conformance kit.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from fake_hw import ArmCore, arm_cpuinfo
from plugin_checks import discovered

from hwplug.conformance import run_conformance
from hwplug.conformance.compare import loosest_tolerance, mismatch
from hwplug.conformance.quant_inputs import random_int4
from hwplug.kernel_registry import kernels
from hwplug.kernel_registry.ops_int4 import int4_linear
from hwplug.kernel_registry.reference.int4 import pack_int4, unpack_int4
from hwplug_cpu_arm import kleidiai

#: Neoverse N1 (Graviton2): dotprod, no bf16, no i8mm. Cortex-A72: Armv8.0, no dotprod.
N1 = ArmCore(part=0xD0C, features="fp asimd evtstrm aes crc32 atomics asimdrdm asimddp")
A72 = ArmCore(part=0xD08, features="fp asimd evtstrm crc32 cpuid")


def case(rows: int, k: int, n: int, group: int, dtype: torch.dtype = torch.float32,
         bias: bool = False, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    qweight, scales = random_int4(generator, n, k, group)
    x = torch.randn(rows, k, generator=generator).to(dtype)
    b = torch.randn(n, generator=generator).to(dtype) if bias else None
    return x, qweight, scales, b


def assert_matches_reference(x, qweight, scales, bias) -> torch.Tensor:
    got = kleidiai.int4_linear(x, qweight, scales, bias)
    want = int4_linear.reference(x, qweight, scales, bias)
    dtype = str(x.dtype).removeprefix("torch.")
    problem = mismatch(got, want, *loosest_tolerance(int4_linear.tolerances, (dtype,)))
    assert problem is None, problem
    return got


@pytest.mark.parametrize(("rows", "k", "n", "group", "bias"), [
    (1, 64, 24, 32, False), (5, 128, 40, 64, True), (33, 192, 8, 192, True),
    (8, 576, 96, 32, False)])
def test_fp32_matches_the_reference_per_group_and_per_row(rows, k, n, group, bias):
    assert kleidiai.int4_linear_supported(*case(rows, k, n, group, bias=bias)) is None
    assert_matches_reference(*case(rows, k, n, group, bias=bias))


def test_bf16_activations_per_row_scales_match_the_reference():
    x, qweight, scales, bias = case(6, 128, 48, 128, torch.bfloat16, bias=True)
    assert assert_matches_reference(x, qweight, scales, bias).dtype == torch.bfloat16


def test_a_leading_batch_shape_is_kept():
    x, qweight, scales, _ = case(6, 64, 16, 32)
    got = kleidiai.int4_linear(x.view(2, 3, 64), qweight, scales)
    assert got.shape == (2, 3, 16)
    torch.testing.assert_close(got.view(6, 16), kleidiai.int4_linear(x, qweight, scales))


@pytest.mark.parametrize(("k", "group", "dtype", "reason"), [
    (64, 16, torch.float32, "group size 16 is neither the row (64) nor a multiple of 32"),
    (128, 32, torch.bfloat16, "bfloat16 activations need one scale per row, got groups of 32"),
])
def test_declines_what_kleidiai_cannot_take(k, group, dtype, reason):
    assert kleidiai.int4_linear_supported(*case(2, k, 8, group, dtype)) == reason


def test_packs_once_and_again_after_the_weight_is_written():
    x, qweight, scales, _ = case(3, 64, 16, 32)
    first = kleidiai.packed_weight(qweight, scales)
    assert kleidiai.packed_weight(qweight, scales) is first  # cached: one pack per weight
    flipped = pack_int4(-unpack_int4(qweight).clamp(min=-7))  # a different int4 weight
    qweight.copy_(flipped)
    assert kleidiai.packed_weight(qweight, scales) is not first
    assert_matches_reference(x, qweight, scales, None)  # the new weight, not the old one
    scales.mul_(2)
    assert_matches_reference(x, qweight, scales, None)


@pytest.fixture
def arm_host(tmp_path, monkeypatch, fresh_discovery):
    def make(core: ArmCore):
        arm_cpuinfo(tmp_path, [core] * 2)
        return discovered(monkeypatch, tmp_path, "cpu-arm")
    return make


def test_chosen_on_arm_cores_with_dotprod_bf16_only_with_bf16(arm_host):
    grace = arm_host(ArmCore())
    assert kernels.explain("int4_linear", grace, "cpu", "float32").chosen.name == "kleidiai"
    assert kernels.explain("int4_linear", grace, "cpu", "bfloat16").chosen.name == \
        "kleidiai_bf16"
    x, qweight, scales, _ = case(4, 64, 16, 32)
    torch.testing.assert_close(int4_linear(x, qweight, scales),
                               kleidiai.int4_linear(x, qweight, scales))
    assert int4_linear.variants_used() == {"kleidiai"}

    graviton2 = arm_host(N1)
    assert kernels.explain("int4_linear", graviton2, "cpu", "float32").chosen.name == "kleidiai"
    bf16 = kernels.explain("int4_linear", graviton2, "cpu", "bfloat16")
    assert bf16.chosen.name == "reference"
    assert bf16.rejected["kleidiai_bf16"] == ("needs device feature bf16 (cpu-arm has: "
                                              "aarch64, dotprod, neon)")


def test_not_chosen_without_dotprod(arm_host):
    why = kernels.explain("int4_linear", arm_host(A72), "cpu", "float32")
    assert why.chosen.name == "reference"
    assert why.rejected["kleidiai"] == "needs device feature dotprod (cpu-arm has: aarch64, neon)"


@pytest.mark.slow
def test_hwplug_kernels_shows_why_it_is_not_chosen_on_this_x86_host(fresh_discovery):
    out = subprocess.run([sys.executable, "-m", "hwplug", "kernels", "--json", "--op",
                          "int4_linear", "--dtype", "float32"], capture_output=True, text=True,
                         timeout=120)  # fresh_discovery left no HWPLUG_* steering set
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["platform"] == "cpu"  # not forced: the plugin's variants are registered
    why = data["ops"]["int4_linear"]["float32"]
    assert why["chosen"] == "reference"
    assert why["rejected"] == {"kleidiai": "serves platform cpu-arm, not cpu",
                               "kleidiai_bf16": "serves platform cpu-arm, not cpu"}


def test_conformance_kit_checks_both_variants_on_a_fake_arm_host(tmp_path, monkeypatch,
                                                                fresh_discovery):
    arm_cpuinfo(tmp_path, [ArmCore()] * 2)
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(tmp_path))
    report = run_conformance("cpu-arm")
    results = {r.check: r for r in report.results}
    for name in ("kernel int4_linear/kleidiai", "kernel int4_linear/kleidiai_bf16"):
        assert results[name].status == "passed", results[name].detail
        assert "declined" in results[name].detail  # groups of 16 (and bf16 groups) fall back
    assert report.ok, report.summary()
