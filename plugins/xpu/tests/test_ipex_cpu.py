"""hwplug-xpu's IPEX variants executed: intel-extension-for-pytorch's CPU build runs the
same ``ipex.llm.modules.PagedAttention`` calls the ``ipex`` variants make on an XPU, on CPU
tensors, against hwplug's reference ops within the ops' stated tolerances.

Skipped where IPEX is not installed (the default environment and CI's default job); the
environment that runs it is ``make test-ipex`` (``.venv-ipex``: torch 2.8.0 and IPEX 2.8.0,
see the plugin's README). What runs here is IPEX's CPU kernels through the frontend
calls; its XPU kernels need an Intel GPU.
"""

from __future__ import annotations

import pytest
import torch
from triton_cases import BATCHES, HEADS, assert_matches, check_attention, paged_batch, write_both

from hwplug.attention import AttentionMetadata, AttentionSpec, PagedAttentionParams
from hwplug.attention_selection import select_backend
from hwplug.cli.kernels import collect
from hwplug.kernel_registry import reference
from hwplug.kv_cache_layout import NHD
from hwplug_xpu import ipex_attention
from hwplug_xpu.backends import IpexAttentionBackend

ipex = pytest.importorskip("intel_extension_for_pytorch")

DTYPES = [torch.bfloat16, torch.float16]


def test_the_installed_release_passes_the_version_gate(max1550):
    """With IPEX's CPU build installed the registry offers both ``ipex`` variants, and the
    xpu platform chooses XPU_IPEX for a bf16 / fp16 model."""
    spec = AttentionSpec(32, 8, 128, "bfloat16", block_size=64)
    assert select_backend(max1550, spec).backend is IpexAttentionBackend
    chosen = collect(["reshape_and_cache", "paged_attention"], ["bfloat16"])["ops"]
    assert {op: chosen[op]["bfloat16"]["chosen"] for op in chosen} == {
        "reshape_and_cache": "ipex", "paged_attention": "ipex"}


@pytest.mark.parametrize("block_size", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_cache_write_matches_the_reference(dtype: torch.dtype, block_size: int) -> None:
    """Strided key/value views, a quarter of the tokens padding (slot -1, not written)."""
    written, expected = write_both(ipex_attention.reshape_and_cache, NHD, (40, 3, 2, 64),
                                   dtype, dtype, block_size, "cpu")
    assert torch.equal(written, expected)


@pytest.mark.parametrize("block_size", [64, 128])
@pytest.mark.parametrize("heads", HEADS, ids=str)
@pytest.mark.parametrize("kind", BATCHES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paged_attention_matches_the_reference(dtype: torch.dtype, kind: str,
                                               heads: tuple[int, int, int],
                                               block_size: int) -> None:
    """Decode, prefill, chunked prefill and a mixed batch with an idle sequence, over
    shuffled block tables padded with -1, GQA and a head size that is not a power of two,
    in both block sizes XPU_IPEX accepts."""
    check_attention(ipex_attention.paged_attention,
                    paged_batch(*BATCHES[kind], heads, block_size, dtype, "cpu"))


@pytest.mark.parametrize(("window", "soft_cap", "causal"),
                         [(7, None, True), (None, 5.0, True), (7, 5.0, True),
                          (None, None, False)])
@pytest.mark.parametrize("kind", BATCHES)
def test_windows_soft_caps_and_non_causal_attention(kind: str, window: int | None,
                                                    soft_cap: float | None,
                                                    causal: bool) -> None:
    """A window of ``w`` keys as ``window_size_left = w - 1``; no soft cap as IPEX's
    ``softcap=-1.0`` (0.0 is not "off" on the CPU build)."""
    batch = paged_batch(*BATCHES[kind], HEADS[1], 64, torch.bfloat16, "cpu")
    check_attention(ipex_attention.paged_attention, batch, sliding_window=window,
                    soft_cap=soft_cap, causal=causal)


def test_a_written_step_is_read_back() -> None:
    """The two calls together, as the XPU_IPEX backend makes them: a prefill's keys written
    through ``reshape_and_cache``, then attended to by its queries."""
    tokens, heads, head_size, block_size = 70, 4, 32, 64
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(tokens, 3, heads, head_size, generator=gen).to(torch.bfloat16)
    cache = torch.zeros(2, 3, block_size, heads, head_size, dtype=torch.bfloat16)
    ref_cache = cache.clone()
    slots = torch.cat([torch.arange(2 * block_size, 3 * block_size),
                       torch.arange(tokens - block_size)])
    metadata = AttentionMetadata(slots, torch.tensor([[2, 0]], dtype=torch.int32),
                                 torch.tensor([tokens], dtype=torch.int32),
                                 torch.tensor([0, tokens], dtype=torch.int32), tokens, tokens)
    params = PagedAttentionParams(head_size ** -0.5)
    ipex_attention.reshape_and_cache(qkv[:, 1], qkv[:, 2], cache, slots, params)
    reference.reshape_and_cache(qkv[:, 1], qkv[:, 2], ref_cache, slots, params)
    assert torch.equal(cache, ref_cache)
    assert_matches("paged_attention", ipex_attention.paged_attention(qkv[:, 0], cache,
                                                                     metadata, params),
                   reference.paged_attention(qkv[:, 0], ref_cache, metadata, params))
