"""``RPA_INTERLEAVED``, hwplug-tpu's KV-cache layout: its contract, its blocks (on
dimension 0), and KV blocks moving through a connector between an engine of this layout
and one of ``NHD``, converted through the reference layout. The layout is pure torch, so
all of it runs on CPU without JAX."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hwplug.conformance.layouts import check_layout
from hwplug.connector import BlockTransfer, ConnectorMetadata, ConnectorRequest, KVLayout
from hwplug.kv_cache_layout import NHD, registered_layout
from hwplug.model_zoo.connectors.shared_storage import SharedStorageConnector
from hwplug_tpu.layout import RPA_INTERLEAVED

GEOMETRY = (6, 4, 2, 8)  # blocks, block size, KV heads, head size
NHD_ENGINE = KVLayout(backend="TORCH_PAGED", layout="NHD", kv_cache_dtype="float32",
                      block_size=4, num_kv_heads=2, head_size=8, num_layers=2)
TPU_ENGINE = replace(NHD_ENGINE, backend="PALLAS_RPA", layout="RPA_INTERLEAVED")
HASHES = ("c3" * 32, "d4" * 32)
SAVED, LOADED = [4, 1], [0, 5]


def test_the_layout_is_registered_and_meets_its_contract(fresh_discovery):
    assert registered_layout("RPA_INTERLEAVED") is RPA_INTERLEAVED
    result = check_layout(RPA_INTERLEAVED)
    assert result.status == "passed", result.detail


def test_blocks_are_pages_and_the_reference_is_a_view():
    pages = torch.arange(6 * 4 * 4 * 8, dtype=torch.float32).view(6, 4, 4, 8)
    reference = RPA_INTERLEAVED.to_reference(pages)
    assert reference.shape == (2, 6, 4, 2, 8) and reference.data_ptr() == pages.data_ptr()
    assert torch.equal(reference[0, 3, 1, 1], pages[3, 1, 2])  # KV head 1's key at head 2
    assert torch.equal(reference[1, 3, 1, 1], pages[3, 1, 3])  # and its value at 3
    blocks = RPA_INTERLEAVED.select_blocks(pages, [2, 0])
    assert torch.equal(blocks, pages[[2, 0]])
    assert torch.equal(RPA_INTERLEAVED.to_reference(blocks), NHD.select_blocks(reference, [2, 0]))
    target = torch.zeros_like(pages)
    RPA_INTERLEAVED.write_blocks(target, [5, 1], blocks)
    assert torch.equal(target[[5, 1]], blocks) and not target[[0, 2, 3, 4]].any()


def _cache(layout: KVLayout, dtype: torch.dtype, seed: int | None) -> torch.Tensor:
    """One layer's cache of ``layout``'s shape: random when ``seed`` is given, else zeros."""
    shape = registered_layout(layout.layout).shape(*GEOMETRY)
    if seed is None:
        return torch.zeros(shape, dtype=dtype)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "fp8_e4m3"])
@pytest.mark.parametrize(("writer", "reader"), [(NHD_ENGINE, TPU_ENGINE),
                                                (TPU_ENGINE, NHD_ENGINE)], ids=["to_tpu", "to_nhd"])
def test_a_connector_moves_blocks_between_engines_of_the_two_layouts(
        fresh_discovery, tmp_path, writer, reader, dtype):
    """An engine saves two blocks of each layer to shared storage; an engine of the other
    layout loads them into two other block ids: read as NHD, the loaded blocks hold the
    saved bytes exactly, and no other block was written."""
    writer, reader = (replace(layout, kv_cache_dtype=dtype) for layout in (writer, reader))
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                   "fp8_e4m3": torch.float8_e4m3fn}[dtype]
    saving = SharedStorageConnector(writer, path=tmp_path)
    loading = SharedStorageConnector(reader, path=tmp_path)
    source = {f"layers.{i}": _cache(writer, torch_dtype, seed=i) for i in range(2)}
    target = {name: _cache(reader, torch_dtype, seed=None) for name in source}
    saves = ConnectorMetadata(saving.fingerprint, saves={"req": [
        BlockTransfer(h, b) for h, b in zip(HASHES, SAVED, strict=True)]})
    for name, cache in source.items():
        saving.save_kv_layer(name, cache, saves)
    saving.wait_for_save()
    assert loading.get_num_new_matched_tokens(ConnectorRequest("req", 8, HASHES), 0) == 8
    loading.start_load_kv(ConnectorMetadata(loading.fingerprint, loads={"req": [
        BlockTransfer(h, b) for h, b in zip(HASHES, LOADED, strict=True)]}), target)
    for name in target:
        loading.wait_for_layer_load(name)
    assert loading.get_block_ids_with_load_errors() == set()
    for name in source:
        saved = NHD.select_blocks(saving.cache_layout.to_reference(source[name]), SAVED)
        loaded = loading.cache_layout.to_reference(target[name])
        assert torch.equal(NHD.select_blocks(loaded, LOADED).view(torch.uint8),
                           saved.contiguous().view(torch.uint8))
        assert not NHD.select_blocks(loaded, [1, 2, 3, 4]).view(torch.uint8).any()
    saving.close()
    loading.close()
