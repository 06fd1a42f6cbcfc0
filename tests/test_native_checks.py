"""The CPU platform's C kernels are memory-safe (issue 29, item 4): outputs are allocated
in the dtype the kernel writes, never torch's process default, and every method that hands
tensors to C checks their dtype, shape and layout first (an ``UnsupportedError``, not a
write past a buffer).

The default-dtype test runs in a subprocess: before the fix a float16 default made the
GGUF embedding's C kernel write float32 rows into half-sized buffers (a heap overflow that
aborts the process).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from gguf import GGMLQuantizationType

from hwplug.attention import AttentionMetadata, PagedAttentionParams
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.reference.ggml import dequantize
from hwplug.kernel_registry.reference.ggml_weights import ggml_weight
from hwplug.platforms.cpu.fused import ops as fused
from hwplug.platforms.cpu.ggml import ops as ggml

#: Greedy tokens of the packaged GGUF model (ggml_embedding, ggml_linear and the fused C
#: ops) and embeddings of the packaged BERT (the C lookup of an fp32 table), under each
#: process default dtype.
SCRIPT = """
import json, torch, hwplug
llm = hwplug.LLM(num_kv_blocks=64, max_model_len=256)
encoder = hwplug.LLM("all-minilm-l6-v2")
params = hwplug.SamplingParams(max_tokens=8, ignore_eos=True)
found = {}
for name in ("float32", "float16", "float64", "bfloat16"):
    torch.set_default_dtype(getattr(torch, name))
    try:
        tokens = [o.token_ids for o in llm.generate(["The capital of France is", "1, 2, 3,"],
                                                   params)]
        vectors = encoder.embed(["a sentence to embed", "another one"])
    finally:
        torch.set_default_dtype(torch.float32)
    found[name] = {"tokens": tokens, "dtype": str(vectors.dtype), "vectors": vectors.tolist()}
print(json.dumps(found))
"""


@pytest.mark.slow
def test_tokens_and_embeddings_do_not_depend_on_the_default_dtype():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.splitlines()[-1])
    want = found.pop("float32")
    for name, got in found.items():
        assert got["tokens"] == want["tokens"], name
        assert got["dtype"] == want["dtype"] == "torch.float32", name
        torch.testing.assert_close(torch.tensor(got["vectors"]), torch.tensor(want["vectors"]),
                                   rtol=0, atol=0, msg=name)


@pytest.fixture(scope="module")
def libraries():
    fused.PORTABLE.ensure_built()
    ggml.PORTABLE.ensure_built()
    return fused.PORTABLE, ggml.PORTABLE


Q4_1 = int(GGMLQuantizationType.Q4_1)
ROWS, COLS = 8, 64


def _qweight() -> torch.Tensor:
    return ggml_weight(torch.Generator().manual_seed(0), Q4_1, ROWS, COLS)


def _decode(heads: int = 4, kv_heads: int = 2, size: int = 16, dtype=torch.float32):
    query = torch.randn(1, heads, size).to(dtype)
    kv_cache = torch.zeros(2, 4, 8, kv_heads, size)
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor([3]), block_tables=torch.tensor([[0, 1]], dtype=torch.int32),
        seq_lens=torch.tensor([4], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 1], dtype=torch.int32), max_query_len=1,
        max_seq_len=4)
    params = PagedAttentionParams(scale=size ** -0.5)
    return query, kv_cache, metadata, params


#: (library index, method, arguments) of calls each C entry point must refuse.
BAD_CALLS = {
    "rms_norm float16": (0, "rms_norm", lambda: (torch.randn(2, 64).half(), torch.ones(64),
                                                  1e-5)),
    "rms_norm short weight": (0, "rms_norm", lambda: (torch.randn(2, 64), torch.ones(32),
                                                       1e-5)),
    "rms_norm strided": (0, "rms_norm", lambda: (torch.randn(64, 2).t(), torch.ones(64),
                                                  1e-5)),
    "silu_and_mul float64": (0, "silu_and_mul", lambda: (torch.randn(2, 64).double(),)),
    "silu_and_mul odd": (0, "silu_and_mul", lambda: (torch.randn(2, 63),)),
    "rotary int32 positions": (0, "rotary_embedding", lambda: (
        torch.zeros(2, dtype=torch.int32), torch.randn(2, 4, 16), torch.randn(2, 2, 16),
        torch.randn(32, 16), True)),
    "rotary short positions": (0, "rotary_embedding", lambda: (
        torch.zeros(1, dtype=torch.int64), torch.randn(4, 4, 16), torch.randn(4, 2, 16),
        torch.randn(32, 16), True)),
    "rotary bfloat16": (0, "rotary_embedding", lambda: (
        torch.zeros(2, dtype=torch.int64), torch.randn(2, 4, 16).bfloat16(),
        torch.randn(2, 2, 16), torch.randn(32, 16), True)),
    "paged_attention float16 query": (0, "paged_attention",
                                      lambda: _decode(dtype=torch.float16)),
    "paged_attention no table row": (0, "paged_attention", lambda: (
        *_decode()[:2], replace(_decode()[2], block_tables=torch.zeros(0, 2, dtype=torch.int32)),
        _decode()[3])),
    "paged_attention longer than its table": (0, "paged_attention", lambda: (
        *_decode()[:2], replace(_decode()[2], seq_lens=torch.tensor([17], dtype=torch.int32)),
        _decode()[3])),
    "reshape_and_cache wrong heads": (0, "reshape_and_cache", lambda: (
        torch.randn(1, 3, 16), torch.randn(1, 3, 16), *_decode()[1:2],
        torch.tensor([3]), _decode()[3])),
    "linear float16": (0, "linear", lambda: (torch.randn(2, 64).half(), torch.randn(8, 64))),
    "linear short weight": (0, "linear", lambda: (torch.randn(2, 64), torch.randn(8, 32))),
    "ggml linear short rows": (1, "linear", lambda: (torch.randn(2, 128), _qweight(), Q4_1)),
    "ggml linear float out": (1, "linear", lambda: (torch.randn(2, COLS), _qweight(), Q4_1,
                                                    None, torch.empty(2, ROWS).half())),
    "ggml linear_blocks out too small": (1, "linear_blocks", lambda: (
        torch.randn(2, COLS), _qweight(), Q4_1, None, "int8", torch.empty(1, ROWS))),
    "ggml linear_blocks int16 of a K-quant": (1, "linear_blocks", lambda: (
        torch.randn(2, 256), ggml_weight(torch.Generator(), 12, ROWS, 256), 12, None,
        "int16")),
    "ggml linear_tiled 3-D x": (1, "linear_tiled", lambda: (torch.randn(1, 2, COLS),
                                                            _qweight(), Q4_1)),
    "ggml embedding float ids": (1, "embedding", lambda: (torch.zeros(2), _qweight(), Q4_1)),
    "ggml embedding strided weight": (1, "embedding", lambda: (
        torch.zeros(2, dtype=torch.int64), torch.cat([_qweight(), _qweight()], 1)[:, ::2],
        Q4_1)),
    "lookup float16 table": (1, "lookup", lambda: (torch.zeros(2, dtype=torch.int64),
                                                   torch.randn(8, 16).half())),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_every_c_entry_point_refuses_arguments_it_would_overrun(libraries, case):
    library, method, arguments = BAD_CALLS[case]
    with pytest.raises(UnsupportedError, match=method):
        getattr(libraries[library], method)(*arguments())


def test_the_checked_entry_points_still_compute_what_the_references_do(libraries):
    lib_fused, lib_ggml = libraries
    x, weight = torch.randn(3, 64), torch.randn(64)
    torch.testing.assert_close(lib_fused.rms_norm(x, weight, 1e-5),
                               torch.nn.functional.rms_norm(x, (64,), weight, 1e-5))
    qweight, ids = _qweight(), torch.tensor([5, 0, 7])
    table = dequantize(qweight, Q4_1)
    torch.testing.assert_close(lib_ggml.embedding(ids, qweight, Q4_1), table[ids])
    torch.testing.assert_close(lib_ggml.lookup(ids, table), table[ids])


@pytest.mark.parametrize("default", [torch.float64, torch.bfloat16])
def test_embedding_rows_are_float32_whatever_the_default_dtype(libraries, default):
    lib_ggml = libraries[1]
    qweight, ids = _qweight(), torch.tensor([5, 0, 7])
    table = dequantize(qweight, Q4_1)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        rows, copied = lib_ggml.embedding(ids, qweight, Q4_1), lib_ggml.lookup(ids, table)
    finally:
        torch.set_default_dtype(previous)
    assert rows.dtype == copied.dtype == torch.float32
    torch.testing.assert_close(rows, table[ids], rtol=0, atol=0)
    torch.testing.assert_close(copied, table[ids], rtol=0, atol=0)
