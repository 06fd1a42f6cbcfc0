"""hwplug-triton's quantized-weight kernels against the reference ops within each op's
stated tolerance: ``ggml_linear`` and ``ggml_embedding`` on raw GGUF rows of every served
type, and ``scaled_mm`` on fp8 operands with every scale granularity (DeepSeek-V3's
128 x 128 weight blocks and per-token groups of 128 activations among them).

Without a GPU the kernels run in the Triton interpreter on small shapes: a few activation
rows (the GEMV tiles, with split K), a few dozen (split K of two) and over a hundred (the
GEMM tiles); on a GPU the shapes are larger.
"""

from __future__ import annotations

import pytest
import torch
from triton_cases import (
    DTYPES,
    ON_GPU,
    assert_matches,
    fresh_registry,
    interpreter_only,
    random,
    skip_fp8_the_gpu_lacks,
)

from hwplug.conformance.variants import check_variant
from hwplug.dtypes import dtype_name
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry import kernels, reference
from hwplug.kernel_registry.reference import ggml
from hwplug.kernel_registry.reference.ggml_weights import ggml_block, ggml_weight
from hwplug_triton import FP8_OPS, register
from hwplug_triton.kernels import ggml_embedding, ggml_linear, scaled_mm
from hwplug_triton.kernels.ggml_blocks import SERVED_TYPES

#: The GGUF types the Triton kernels serve (of those hwplug's references dequantize).
GGML_TYPES = tuple(int(kind) for kind in SERVED_TYPES)
NAMES = {kind: ggml.type_name(kind) for kind in GGML_TYPES}
#: activation rows: the decode bucket (split K), the middle one and the GEMM tiles.
ROWS = (3, 40, 300) if ON_GPU else (3, 40, 100)
#: (output rows N, input values K per block size) of the weights.
GGML_SHAPES = {32: (200, 1024), 256: (200, 2048)} if ON_GPU else {32: (40, 192), 256: (24, 512)}


def gguf_rows(kind: int, device: str, seed: int = 0) -> torch.Tensor:
    n, k = GGML_SHAPES[ggml_block(kind)]
    return ggml_weight(torch.Generator().manual_seed(seed), kind, n, k).to(device)


# --- ggml_linear -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", GGML_TYPES, ids=NAMES.get)
def test_ggml_linear_matches_the_reference(device: str, kind: int, dtype: torch.dtype) -> None:
    qweight = gguf_rows(kind, device)
    n, k = GGML_SHAPES[ggml_block(kind)]
    for i, m in enumerate(ROWS):
        x = random(m, k, dtype=dtype, device=device, seed=i)
        bias = random(n, dtype=dtype, device=device, seed=9) if i % 2 else None
        assert_matches("ggml_linear", ggml_linear.ggml_linear(x, qweight, kind, bias),
                       ggml.ggml_linear(x, qweight, kind, bias))


def test_ggml_linear_keeps_leading_dimensions_and_reads_strided_rows(device: str) -> None:
    kind = int(ggml.Q.Q4_K)
    qweight = gguf_rows(kind, device)
    # every other row of a larger table: row stride twice the row's bytes
    spaced = torch.zeros(2 * qweight.shape[0], qweight.shape[1], dtype=torch.uint8,
                         device=device)
    spaced[::2] = qweight
    x = random(2, 3, GGML_SHAPES[256][1], dtype=torch.float16, device=device)
    out = ggml_linear.ggml_linear(x, spaced[::2], kind)
    assert out.shape == (2, 3, qweight.shape[0]) and out.dtype == torch.float16
    assert_matches("ggml_linear", out, ggml.ggml_linear(x, qweight, kind))


@interpreter_only
def test_ggml_linear_declines_what_it_does_not_serve() -> None:
    q4_0 = int(ggml.Q.Q4_0)
    qweight = gguf_rows(q4_0, "cpu")
    x = torch.zeros(2, GGML_SHAPES[32][1])
    assert ggml_linear.supported(x, qweight, q4_0) is None
    reasons = {
        "GGUF type F16 not served (serves Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)":
            (x, qweight, int(ggml.Q.F16)),
        "GGUF type Q2_K not served": (x, qweight, int(ggml.Q.Q2_K)),
        "rows of 108 bytes are not 192 Q4_K values": (x, qweight, int(ggml.Q.Q4_K)),
        "rows of 108 bytes are not 64 Q4_0 values": (x[:, :64], qweight, q4_0),
        "even byte addresses": (x[:, :160], qweight[:, 1:91], q4_0),
        "x dtype torch.int8 not in fp32, bf16, fp16": (x.to(torch.int8), qweight, q4_0),
    }
    for reason, args in reasons.items():
        assert reason in ggml_linear.supported(*args)
    assert "bias of shape [3]" in ggml_linear.supported(x, qweight, q4_0, torch.zeros(3))
    with pytest.raises(UnsupportedError, match="GGUF type Q2_K not served"):
        ggml_linear.ggml_linear(x, qweight, int(ggml.Q.Q2_K))


# --- ggml_embedding ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", GGML_TYPES, ids=NAMES.get)
def test_ggml_embedding_dequantizes_the_rows_it_is_asked_for(device: str, kind: int) -> None:
    qweight = gguf_rows(kind, device)
    rows = qweight.shape[0]
    for id_dtype in (torch.int64, torch.int32):
        ids = torch.tensor([5, 0, rows - 1, 5, 2, 7, 1], dtype=id_dtype, device=device)
        assert_matches("ggml_embedding", ggml_embedding.ggml_embedding(ids, qweight, kind),
                       ggml.ggml_embedding(ids, qweight, kind), id_dtype)


@interpreter_only
def test_ggml_embedding_rejects_ids_outside_the_table() -> None:
    kind = int(ggml.Q.Q8_0)
    qweight = gguf_rows(kind, "cpu")
    with pytest.raises(UnsupportedError, match=r"token ids must lie in \[0, 40\)"):
        ggml_embedding.ggml_embedding(torch.tensor([1, 40]), qweight, kind)
    assert ggml_embedding.ggml_embedding(torch.tensor([], dtype=torch.int64), qweight,
                                         kind).shape == (0, GGML_SHAPES[32][1])
    assert "not served" in ggml_embedding.supported(torch.tensor([0]), qweight, 1)


# --- scaled_mm (fp8) -----------------------------------------------------------------------

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
#: torch's fnuz formats -> hwplug's name of the format of the same width, whose tolerance
#: applies (scaled_mm's tolerances name the OCP formats only).
TOLERANCE_OF = {torch.float8_e4m3fnuz: "fp8_e4m3", torch.float8_e5m2fnuz: "fp8_e5m2"}
M_ROWS, K, N = (300, 1024, 768) if ON_GPU else (40, 384, 256)


def fp8_case(fp8: torch.dtype, scales: str, device: str, m: int = M_ROWS
             ) -> tuple[torch.Tensor, ...]:
    """``(a, b, scale_a, scale_b)`` as the fp8 method passes them: ``b`` the transposed
    weight and block scales transposed views of the checkpoint's ``[N / 128, K / 128]``."""
    gen = torch.Generator().manual_seed(0)
    a = (torch.randn(m, K, generator=gen) * 3).to(fp8)
    weight = (torch.randn(N, K, generator=gen) * 3).to(fp8)
    scale_a, scale_b = {
        "tensor": lambda: (torch.rand(()), torch.rand(())),
        "token_channel": lambda: (torch.rand(m, 1), torch.rand(1, N)),
        "block": lambda: (torch.rand(m, K // 128), torch.rand(N // 128, K // 128).t()),
        "group64_block": lambda: (torch.rand(m, K // 64), torch.rand(N // 128, K // 128).t()),
    }[scales]()
    return tuple(t.to(device) for t in (a, weight.t(), scale_a + 0.1, scale_b + 0.1))


def assert_scaled_mm_matches(args: tuple[torch.Tensor, ...], out_dtype: torch.dtype,
                             bias: torch.Tensor | None) -> None:
    actual = scaled_mm.scaled_mm(*args, out_dtype, bias)
    expected = reference.scaled_mm(*args, out_dtype, bias)
    assert actual.dtype == out_dtype and actual.shape == expected.shape
    tolerances = kernels.op("scaled_mm").tolerances
    names = (TOLERANCE_OF.get(args[0].dtype) or dtype_name(args[0].dtype), dtype_name(out_dtype))
    atol, rtol = (max(tolerances[name][i] for name in names) for i in (0, 1))
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("scales", ["tensor", "token_channel", "block", "group64_block"])
@pytest.mark.parametrize("fp8", FP8, ids=str)
def test_scaled_mm_matches_the_reference(device: str, fp8: torch.dtype, scales: str) -> None:
    skip_fp8_the_gpu_lacks(fp8)
    bias = random(N, dtype=torch.float32, device=device, seed=5)
    assert_scaled_mm_matches(fp8_case(fp8, scales, device), torch.float32, bias)


@pytest.mark.parametrize("out_dtype", DTYPES, ids=str)
def test_scaled_mm_block_scales_in_every_output_dtype(device: str,
                                                      out_dtype: torch.dtype) -> None:
    for m in (1, 130):  # the decode tile and more than one row tile
        args = fp8_case(torch.float8_e4m3fn, "block", device, m)
        assert_scaled_mm_matches(args, out_dtype, None)
    a, b, scale_a, scale_b = fp8_case(torch.float8_e4m3fn, "block", device)
    bias = random(N, dtype=out_dtype, device=device, seed=6)
    assert_scaled_mm_matches((a, b.contiguous(), scale_a, scale_b.contiguous()), out_dtype,
                             bias)


def test_scaled_mm_declines_what_it_does_not_serve() -> None:
    a, b, scale_a, scale_b = fp8_case(torch.float8_e4m3fn, "block", "cpu")
    assert scaled_mm.supported(a, b, scale_a, scale_b, torch.bfloat16) is None
    one = torch.ones(())
    reasons = {
        "needs a and b in one fp8 format": (a, b.to(torch.float8_e5m2), scale_a, scale_b),
        "torch.int8 and torch.int8": (a.to(torch.int8), b.to(torch.int8), one, one),
        "K groups of 16 values": (a, b, torch.ones(M_ROWS, K // 16), one),
        f"5 scales do not split a dimension of {K}": (a, b, torch.ones(M_ROWS, 5), one),
        "needs a [M, K] and b [K, N]": (a, b[:128], one, one),
    }
    for reason, args in reasons.items():
        assert reason in scaled_mm.supported(*args, torch.bfloat16)
    assert "out_dtype torch.int32" in scaled_mm.supported(a, b, one, one, torch.int32)
    assert "bias of shape [3]" in scaled_mm.supported(a, b, one, one, torch.float32,
                                                      torch.zeros(3))
    with pytest.raises(UnsupportedError, match="K groups of 16"):
        scaled_mm.scaled_mm(a, b, torch.ones(M_ROWS, K // 16), one, torch.float32)


@interpreter_only
def test_the_conformance_kit_passes_the_fp8_variant_as_a_plugin_registers_it() -> None:
    """No GPU plugin registers ``scaled_mm`` here (it needs fp8 dots): the kit checks the
    variant ``hwplug_triton.register`` makes of it, on the kit's own drawn inputs."""
    registry = fresh_registry()
    register(registry, platforms=(), ops=FP8_OPS)
    (variant,) = [v for v in registry.variants("scaled_mm") if v.name == "triton"]
    result = check_variant(variant, examples=12)
    assert (result.status, result.simulation) == ("simulated", "Triton interpreter"), result
