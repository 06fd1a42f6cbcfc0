"""What ``scaled_mm/cublaslt_fp8`` accepts: the calls cuBLASLt runs, and a reason for the
rest (an H100 raised on e5m2 x e5m2, which the CPU stand-in of the conformance kit runs)."""

from __future__ import annotations

import pytest
import torch

from hwplug_cuda.scaled_mm import supported

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
ONE = torch.ones(())


def operands(a_dtype: torch.dtype, b_dtype: torch.dtype, k: int = 32, n: int = 16):
    return torch.zeros(4, k).to(a_dtype), torch.zeros(k, n).to(b_dtype)


@pytest.mark.parametrize("a_dtype, b_dtype", [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)])
def test_the_fp8_pairs_cublaslt_multiplies_are_accepted(a_dtype, b_dtype) -> None:
    assert supported(*operands(a_dtype, b_dtype), ONE, ONE, torch.float32) is None


def test_two_e5m2_operands_are_refused_with_the_pairs_it_takes() -> None:
    reason = supported(*operands(E5M2, E5M2), ONE, ONE, torch.float32)
    assert reason is not None and "both float8_e5m2" in reason and "e4m3 x e5m2" in reason


@pytest.mark.parametrize("k, n, scale, expected", [
    (24, 16, ONE, "multiples of 16"), (32, 8, ONE, "multiples of 16"),
    (32, 16, torch.ones(4, 1), "per-tensor scales")])
def test_shapes_and_scales_cublaslt_declines_are_refused(k, n, scale, expected) -> None:
    assert expected in supported(*operands(E4M3, E4M3, k, n), scale, ONE, torch.float32)
